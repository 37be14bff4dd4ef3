"""PersonalRewardBench-style benchmarks: per-user histories of chosen/rejected pairs and a new pair."""

import json

import pytest
from django.core.management import CommandError, call_command

from pipeline.models import Benchmark
from pipeline.services import item_pair_input
from tests.pipeline.test_formats import make_row, write_jsonl

pytestmark = pytest.mark.django_db


def history_row(i: int, category: str = "PRISM") -> dict:
    return {"id": f"h{i}", "user_id": f"user-{i % 3}", "category": category,
            "question": f"Recommend a weekend activity ({i}).",
            "history": [{"prompt": "Suggest a film.", "chosen": "A quiet documentary.", "rejected": "A loud action movie."},
                        {"prompt": "Suggest a dinner.", "chosen": "Home-cooked soup.", "rejected": "A fancy buffet."}],
            "chosen": "A slow walk in a botanical garden.", "rejected": "A packed theme park."}


def test_pair_history_rows_import_and_export_unchanged(tmp_path):
    rows = [history_row(i) for i in range(3)] + [history_row(3, "chatbot_arena")]
    src = write_jsonl(tmp_path / "prism.jsonl", rows)
    call_command("import_benchmark", str(src), "--name", "prism-like")
    bench = Benchmark.objects.get(name="prism-like")
    assert bench.kind == "pair_history" and bench.item_count == 4
    assert set(bench.items.values_list("domain", flat=True)) == {"prism", "chatbot_arena"}
    out = tmp_path / "out.jsonl"
    call_command("export_benchmark", "--name", "prism-like", "--out", str(out))
    assert [json.loads(line) for line in out.read_text().splitlines()] == rows


def test_the_history_becomes_the_profile_every_rm_kind_sees(tmp_path):
    call_command("import_benchmark", str(write_jsonl(tmp_path / "p.jsonl", [history_row(0)])), "--name", "p")
    pair = item_pair_input(Benchmark.objects.get(name="p").items.get())
    assert pair.history[0]["chosen"] == "A quiet documentary."
    assert pair.profile[0] == "Asked: Suggest a film. | Preferred: A quiet documentary. | Over: A loud action movie."


@pytest.mark.parametrize("mutate,expected", [
    (lambda r: r["history"][1].pop("rejected"), "field 'history[1].rejected': missing field"),
    (lambda r: r.update(history="none"), "field 'history': expected a list"),
    (lambda r: r.pop("user_id"), "field 'user_id': missing field"),
    (lambda r: r.update(category="Reddit"), "unknown category 'Reddit'"),
])
def test_bad_history_rows_are_refused_with_the_field_named(tmp_path, mutate, expected):
    row = history_row(0)
    mutate(row)
    with pytest.raises(CommandError, match=expected.replace("[", r"\[").replace("]", r"\]")):
        call_command("import_benchmark", str(write_jsonl(tmp_path / "p.jsonl", [row])), "--name", "p")
    assert not Benchmark.objects.exists()


def test_a_file_mixing_both_kinds_is_refused(tmp_path):
    src = write_jsonl(tmp_path / "mixed.jsonl", [make_row(1), history_row(2)])
    with pytest.raises(CommandError, match="line 2: mixes profile-rubric rows with pair-history rows"):
        call_command("import_benchmark", str(src), "--name", "mixed")
