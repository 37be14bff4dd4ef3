"""Static files in production: hashed names, a long cache, and a loud start without collectstatic."""

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import subprocess_env

ROOT = Path(__file__).resolve().parents[2]
PRODUCTION = {"DEBUG": "0", "SECRET_KEY": "x" * 50, "ALLOWED_HOSTS": "testserver", "SECURE_SSL_REDIRECT": "0"}


def run(code: str, var: Path) -> subprocess.CompletedProcess:
    env = subprocess_env(**PRODUCTION, PRBENCH_VAR_DIR=str(var))
    env.pop("PYTEST_VERSION", None)
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)


def test_without_debug_the_server_refuses_to_start_until_static_files_are_collected(tmp_path):
    started = run("import prbench.wsgi", tmp_path)
    assert started.returncode != 0
    assert "static files are not collected" in started.stderr and "collectstatic --noinput" in started.stderr


def test_collected_static_files_have_hashed_names_and_a_long_cache(tmp_path):
    collect = run("import django, os; os.environ.setdefault('DJANGO_SETTINGS_MODULE', 'prbench.settings'); "
                  "django.setup(); from django.core.management import call_command; "
                  "call_command('collectstatic', '--noinput', verbosity=0)", tmp_path)
    assert collect.returncode == 0, collect.stderr
    served = run(
        "import prbench.wsgi\n"
        "from django.templatetags.static import static\n"
        "from django.test import Client\n"
        "url = static('vendor/plotly/plotly.min.js')\n"
        "r = Client().get(url)\n"
        "print(url, r.status_code, r['Cache-Control'])\n", tmp_path)
    assert served.returncode == 0, served.stderr
    url, status, cache = served.stdout.split(" ", 2)
    assert url.startswith("/static/vendor/plotly/plotly.min.") and url.endswith(".js") and url.count(".") == 3
    assert status == "200"
    max_age = int(cache.split("max-age=")[1].split(",")[0])
    assert max_age >= 365 * 24 * 3600 and "immutable" in cache
