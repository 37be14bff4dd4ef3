# prbench: `make demo` to use the app locally, `make test` to run the whole suite.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
HOST ?= 127.0.0.1
PORT ?= 8000

.PHONY: demo test venv migrate worker serve bench clean

venv: $(STAMP)

# Re-install whenever a requirements file changes.
$(STAMP): requirements.txt requirements-dev.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements-dev.txt
	touch $(STAMP)

migrate: venv
	$(PY) manage.py migrate --noinput

# Everything on the embedded default (SQLite file + filesystem broker under var/),
# or on PostgreSQL/Redis when DATABASE_URL / CELERY_BROKER_URL are set.
demo: migrate
	$(PY) manage.py seed_demo
	@mkdir -p var/log
	@echo "Starting a Celery worker with beat (queues default,gpu; log: var/log/worker.log)"
	@$(PY) -m celery -A prbench worker -Q default,gpu --concurrency 1 --beat --loglevel INFO \
		>var/log/worker.log 2>&1 & worker=$$!; \
	trap 'kill $$worker 2>/dev/null; wait $$worker 2>/dev/null' EXIT INT TERM; \
	echo; echo "  prbench is running at http://$(HOST):$(PORT)/   (Ctrl-C stops the server and the worker)"; echo; \
	$(PY) manage.py runserver $(HOST):$(PORT)

worker: venv
	$(PY) -m celery -A prbench worker -Q default,gpu --concurrency 1 --beat --loglevel INFO

test: venv
	$(PY) -m pytest $(PYTEST_ARGS)

# Every benchmarks/bench_*.py with its defaults (benchmarks/README.md); one that fails (e.g.
# bench_annotation without PostgreSQL) is named at the end and makes the target fail, after the others ran.
bench: venv
	@failed=""; for script in benchmarks/bench_*.py; do echo "== $$script"; uptime; \
		$(PY) $$script || failed="$$failed $$script"; done; \
	if [ -n "$$failed" ]; then echo "failed:$$failed"; exit 1; fi

clean:
	rm -rf var/test var/broker
