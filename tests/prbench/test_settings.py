"""The env-driven settings module: safe local defaults, loud failures on bad values."""

import secrets
import subprocess
import sys

import pytest

from tests.conftest import BASE_DIR

CLEAN_ENV = {"PATH": "/usr/bin:/bin", "PYTEST_VERSION": "1", "HOME": "/tmp"}


def run_manage(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "manage.py", *args], cwd=BASE_DIR, env={**CLEAN_ENV, **env},
                          capture_output=True, text=True, timeout=120)


def settings_value(expr: str, **env: str) -> str:
    code = f"import django, os; os.environ['DJANGO_SETTINGS_MODULE']='prbench.settings'; " \
           f"from django.conf import settings as s; print({expr})"
    proc = subprocess.run([sys.executable, "-c", code], cwd=BASE_DIR, env={**CLEAN_ENV, **env},
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_no_environment_means_sqlite_and_a_serverless_broker():
    assert settings_value("s.DATABASES['default']['ENGINE']") == "django.db.backends.sqlite3"
    assert settings_value("s.CELERY_BROKER_URL") == "filesystem://localhost/"
    assert settings_value("s.DEBUG") == "True"


def test_urls_switch_to_postgresql_and_redis():
    env = {"DATABASE_URL": "postgres://u:p@db.internal:5433/prb", "CELERY_BROKER_URL": "redis://cache:6379/2"}
    assert settings_value("s.DATABASES['default']['ENGINE'], s.DATABASES['default']['PORT']", **env) == \
        "django.db.backends.postgresql 5433"
    assert settings_value("s.CELERY_BROKER_URL", **env) == "redis://cache:6379/2"


def test_postgresql_prepares_hot_statements_unless_a_pooler_forbids_it():
    """Django leaves prepare_threshold at None (nothing is ever prepared); on PostgreSQL we bind
    server-side and prepare after 5 runs, and DB_PREPARED_STATEMENTS=0 turns both off."""
    env = {"DATABASE_URL": "postgres://u:p@db.internal:5432/prb"}
    options = "sorted(s.DATABASES['default'].get('OPTIONS', {}).items())"
    assert settings_value(options, **env) == "[('prepare_threshold', 5), ('server_side_binding', True)]"
    assert settings_value(options, DB_PREPARED_STATEMENTS="0", **env) == "[]"
    assert "prepare_threshold" not in settings_value(options)  # SQLite: not a PostgreSQL option


@pytest.mark.parametrize("env,message", [
    ({"DEBUG": "perhaps"}, "DEBUG='perhaps' is not a boolean"),
    ({"DATABASE_URL": "oracle-ish://x"}, "DATABASE_URL is malformed"),
    ({"CELERY_BROKER_URL": "kafka://x"}, "unsupported scheme"),
    ({"CELERY_TASK_SOFT_TIME_LIMIT": "ten"}, "CELERY_TASK_SOFT_TIME_LIMIT='ten' is not an integer"),
    ({"CELERY_TASK_SOFT_TIME_LIMIT": "100", "CELERY_TASK_TIME_LIMIT": "50"}, "must be greater"),
    ({"DEBUG": "0"}, "SECRET_KEY must be set when DEBUG is off"),
    ({"DEBUG": "0", "SECRET_KEY": "x" * 60}, "ALLOWED_HOSTS must be set when DEBUG is off"),
])
def test_malformed_or_missing_values_fail_loudly(env, message):
    proc = run_manage("check", **env)
    assert proc.returncode != 0
    assert "ImproperlyConfigured" in proc.stderr and message in proc.stderr


def test_production_settings_pass_the_deploy_check():
    proc = run_manage("check", "--deploy", "--fail-level", "WARNING", DEBUG="0",
                      SECRET_KEY=secrets.token_urlsafe(64), ALLOWED_HOSTS="prbench.example.org")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "no issues" in proc.stdout
