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


def test_greek_symbols_in_table_headers_keep_their_case():
    """Table headers are styled uppercase, which turns "Spearman ρ" into "SPEARMAN Ρ" (a Latin-looking
    P, beside the p-value column) and α into A: every Greek letter in a template's <th> sits in
    a span of class "sym", which the stylesheet exempts."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    css = (root / "static/css/prbench.css").read_text(encoding="utf-8")
    assert re.search(r"\.sym\s*\{\s*text-transform:\s*none;", css)
    bare = []
    for template in (root / "templates").rglob("*.html"):
        for header in re.findall(r"<th\b[^>]*>(.*?)</th>", template.read_text(encoding="utf-8"), flags=re.S):
            unwrapped = re.sub(r'<span class="sym">[^<]*</span>', "", header)
            bare += [f"{template.relative_to(root)}: {header}" for _ in re.findall("[\u0370-\u03ff]", unwrapped)[:1]]
    assert bare == []
    report = (root / "templates/annotation/report.html").read_text(encoding="utf-8")
    assert 'Krippendorff <span class="sym">α</span>' in report  # the check reads this template's headers
