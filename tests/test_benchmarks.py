"""`make bench` runs every script in benchmarks/: a name one of them imports from the project
(its apps, the tests' model builders, or another script such as bench_scoring or common) must
still exist (a moved function broke bench_scoring once; cuda_check runs only on a GPU machine).
Checked by reading the scripts' imports, without running them (each takes minutes)."""

import ast
import importlib
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
SIBLINGS = frozenset(p.stem for p in BENCHMARKS.glob("*.py"))
PROJECT = frozenset({"pipeline", "leaderboard", "annotation", "jobs", "prbench", "tests"}) | SIBLINGS


def project_imports(script: Path) -> list[tuple[str, str]]:
    found = []
    for node in ast.walk(ast.parse(script.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in PROJECT:
            found += [(node.module, alias.name) for alias in node.names]
    return found


@pytest.mark.parametrize("script", sorted(BENCHMARKS.glob("*.py")), ids=lambda p: p.name)
def test_every_name_a_benchmark_imports_from_the_project_exists(script, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))  # the scripts import each other as top-level modules
    for module, name in project_imports(script):
        assert hasattr(importlib.import_module(module), name), f"{script.name}: {module} has no {name}"


def test_the_check_finds_a_moved_name(tmp_path):
    script = tmp_path / "bench_x.py"
    script.write_text("from pipeline.ml.base import ModelSpec, render_context\n", encoding="utf-8")
    missing = [(m, n) for m, n in project_imports(script) if not hasattr(importlib.import_module(m), n)]
    assert missing == [("pipeline.ml.base", "render_context")]


def test_imports_from_another_script_and_the_tests_are_checked_too(tmp_path):
    script = tmp_path / "bench_y.py"
    script.write_text("from bench_scoring import baseline\nfrom tests.pipeline.ml.tiny_models import build_decoder_rm\n",
                      encoding="utf-8")
    assert project_imports(script) == [("bench_scoring", "baseline"), ("tests.pipeline.ml.tiny_models", "build_decoder_rm")]
