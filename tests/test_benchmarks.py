"""`make bench` runs every script in benchmarks/: a name one of them imports from the project
(its apps, the model library, or another script such as bench_scoring or common) must still
exist (a moved function broke bench_scoring once; cuda_check runs only on a GPU machine), and no
script imports test code (tests/ is not shipped with the library the scripts measure). Checked by
reading the scripts' imports, without running them (each takes minutes)."""

import ast
import importlib
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
SIBLINGS = frozenset(p.stem for p in BENCHMARKS.glob("*.py"))
PROJECT = frozenset({"prblib", "core", "pipeline", "leaderboard", "annotation", "jobs", "prbench", "tests"}) | SIBLINGS


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
        assert exists(module, name), f"{script.name}: {module} has no {name}"


def exists(module: str, name: str) -> bool:
    """`from module import name` would work: a name in the module, or a submodule of a package."""
    if hasattr(importlib.import_module(module), name):
        return True
    try:
        importlib.import_module(f"{module}.{name}")
    except ModuleNotFoundError:
        return False
    return True


@pytest.mark.parametrize("script", sorted(BENCHMARKS.glob("*.py")), ids=lambda p: p.name)
def test_no_benchmark_imports_test_code(script):
    assert [m for m, _ in project_imports(script) if m.split(".")[0] == "tests"] == []
    plain = [n.names[0].name for n in ast.walk(ast.parse(script.read_text(encoding="utf-8")))
             if isinstance(n, ast.Import) and n.names[0].name.split(".")[0] == "tests"]
    assert plain == []


def test_the_check_finds_a_moved_name(tmp_path):
    script = tmp_path / "bench_x.py"
    script.write_text("from prblib.rewards.base import ModelSpec, render_context\n", encoding="utf-8")
    missing = [(m, n) for m, n in project_imports(script) if not exists(m, n)]
    assert missing == [("prblib.rewards.base", "render_context")]


def test_imports_from_another_script_the_library_and_the_tests_are_found(tmp_path):
    script = tmp_path / "bench_y.py"
    script.write_text("from bench_scoring import baseline\nfrom prblib.tiny_models import build_decoder_rm\n"
                      "from tests.factories import UserFactory\n", encoding="utf-8")
    assert project_imports(script) == [("bench_scoring", "baseline"), ("prblib.tiny_models", "build_decoder_rm"),
                                       ("tests.factories", "UserFactory")]


def test_bench_evaluate_counts_the_work_of_both_sides_as_worked_out_by_hand(tmp_path, monkeypatch):
    """The ceiling bench_evaluate prints rests on this count; the right values are worked out here."""
    import json

    from prblib.tiny_models import load_tokenizer

    monkeypatch.syspath_prepend(str(BENCHMARKS))
    from bench_evaluate import multiply_accumulates

    load_tokenizer().save_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({
        "hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2,
        "num_key_value_heads": 1, "head_dim": 4}))
    inputs = tmp_path / "inputs.jsonl"
    inputs.write_text(json.dumps({"id": "p", "chosen_text": "the red dog", "rejected_text": "the red cat ran"}) + "\n")
    # Per token and layer: q and o 2*8*2*4 = 128, k and v 2*8*1*4 = 64, MLP 3*8*16 = 384: 576,
    # plus attention 2*2*4 = 16 per token of context.
    # Plain, one batch of both texts padded to 4 tokens, full attention: 2 * 4 * (576 + 16*4) = 5120.
    # Engine: the prefix "the red" 2 * (576 + 16*1.5) = 1200; "dog" 1 * (576 + 16*(2 + 1)) = 624;
    # "cat ran" 2 * (576 + 16*(2 + 1.5)) = 1264; 3088 in all. Two layers double both.
    assert multiply_accumulates(tmp_path, inputs, batch=2) == (10240, 6176)
