"""The published PersonalRewardBench schema: detection, histories from the user's other rows, round trip."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from django.core.management import CommandError, call_command

from pipeline import domains
from pipeline.formats import FormatError, read_records
from pipeline.models import Benchmark, HistoryRow
from tests.pipeline.prb_data import prb_row, prb_rows, write_prb


def test_published_rows_are_detected_and_only_test_rows_become_items(tmp_path):
    folder = write_prb(tmp_path)
    records = list(read_records(folder))
    assert len(records) == 12 * 7
    tests = [r for r in records if r.split == "test"]
    assert len(tests) == 24
    first = next(r for r in tests if r.source_id == "c00-5")
    assert first.user_id == "user00" and first.domain == domains.PRISM and first.category == "PRISM"
    assert first.question == "Tell me about rainfall (question 5 of user 0)."
    assert first.chosen == "Rainfall: keep it simple."
    # History: the same user's train rows only (indices 0-3), never val (4) or test (5, 6) rows.
    assert len(first.history) == 4
    prompts = {h["prompt"] for h in first.history}
    assert prompts == {f"Tell me about {t} (question {i} of user 0)." for i, t in
                       enumerate(("tea", "bicycles", "jazz", "tomatoes"))}


def test_history_size_and_seed_decide_the_sample(tmp_path):
    folder = write_prb(tmp_path)
    def histories(**kwargs):
        return {r.source_id: r.history for r in read_records(folder, **kwargs) if r.split == "test"}
    two = histories(history_size=2, seed=1)
    assert all(len(h) == 2 for h in two.values())
    assert two == histories(history_size=2, seed=1)
    assert two != histories(history_size=2, seed=2)
    assert all(h == [] for h in histories(history_size=0).values())


def test_identical_train_rows_appear_once_in_a_history(tmp_path):
    rows = [prb_row(0, 0, "train"), {**prb_row(0, 0, "train"), "conversation_id": "dup"}, prb_row(0, 1, "test")]
    records = list(read_records(write_prb(tmp_path, rows)))
    assert len(records[-1].history) == 1


def test_a_bad_row_is_named_by_file_line_and_field(tmp_path):
    rows = prb_rows()
    rows[3] = {**rows[3], "split": "dev"}
    folder = write_prb(tmp_path, rows)
    with pytest.raises(FormatError) as info:
        list(read_records(folder))
    assert str(info.value).endswith("data.jsonl, line 4, field 'split': must be one of train, val, test, not 'dev'")
    rows = prb_rows()
    del rows[0]["chosen"]["content"]
    with pytest.raises(FormatError, match=r"line 1, field 'chosen.content': missing field"):
        list(read_records(write_prb(tmp_path, rows), format="personalrewardbench"))


def test_a_row_whose_set_cannot_be_told_needs_a_category(tmp_path):
    folder = write_prb(tmp_path, name="data")
    with pytest.raises(FormatError, match="PRISM or Chatbot Arena"):
        list(read_records(folder))
    assert {r.domain for r in read_records(folder, category="Chatbot_Arena")} == {domains.ARENA}


@pytest.mark.django_db
def test_import_keeps_test_rows_as_items_and_exports_every_row_back(tmp_path, capsys):
    folder = write_prb(tmp_path)
    call_command("import_benchmark", str(folder), "--name", "prism-synth")
    bench = Benchmark.objects.get(name="prism-synth")
    assert bench.kind == Benchmark.Kind.PAIR_HISTORY
    assert bench.item_count == 24 == bench.items.count()
    assert HistoryRow.objects.filter(benchmark=bench).count() == 60
    assert set(HistoryRow.objects.values_list("split", flat=True)) == {"train", "val"}
    item = bench.items.get(source_id="c03-6")
    assert item.extra["personalrewardbench"]["chosen_score"] == 86.0  # scores, type, turns kept
    out = tmp_path / "out.jsonl"
    call_command("export_benchmark", "--name", "prism-synth", "--out", str(out))
    assert [json.loads(line) for line in out.read_text().splitlines()] == prb_rows()
    # Re-importing the export under the same name is a no-op; another history size is other content.
    call_command("import_benchmark", str(folder), "--name", "prism-synth")
    assert "already holds this content" in capsys.readouterr().out
    with pytest.raises(CommandError, match="different content"):
        call_command("import_benchmark", str(folder), "--name", "prism-synth", "--history-size", "2")


@pytest.mark.django_db
def test_parquet_in_the_dataset_folder_layout_imports(tmp_path):
    folder = tmp_path / "chatbot_arena_personalized_0125" / "data"
    folder.mkdir(parents=True)
    rows = prb_rows()
    for split in ("train", "val", "test"):
        pq.write_table(pa.Table.from_pylist([r for r in rows if r["split"] == split]),
                       folder / f"{split}-00000-of-00001.parquet")
    call_command("import_benchmark", str(folder.parent), "--name", "arena-synth", "--format", "personalrewardbench")
    bench = Benchmark.objects.get(name="arena-synth")
    assert bench.item_count == 24
    assert set(bench.items.values_list("domain", flat=True)) == {domains.ARENA}


@pytest.mark.django_db
def test_a_missing_score_read_as_nan_is_stored_and_exported_as_null(tmp_path):
    folder = tmp_path / "prism_personalized_0125"
    folder.mkdir()
    rows = prb_rows()
    rows[0]["chosen_score"] = float("nan")
    pq.write_table(pa.Table.from_pylist(rows), folder / "test.parquet")
    call_command("import_benchmark", str(folder), "--name", "nan")
    out = tmp_path / "out.jsonl"
    call_command("export_benchmark", "--name", "nan", "--out", str(out))
    exported = [json.loads(line) for line in out.read_text().splitlines()]
    assert exported[0]["chosen_score"] is None and exported[1:] == rows[1:]


@pytest.mark.django_db
def test_a_file_without_test_rows_is_refused_in_one_line(tmp_path):
    folder = write_prb(tmp_path, [r for r in prb_rows() if r["split"] != "test"])
    with pytest.raises(CommandError, match="no test-split rows"):
        call_command("import_benchmark", str(folder), "--name", "x")
    assert Benchmark.objects.count() == 0


def release_histories(rows: list[dict], k: int, seed: int = 42) -> dict[str, list[str]]:
    """The release's sampling, written from its description (QC Character-GenRM/utils.py:216-251): the
    global RNG seeded once, users in order, per test row `random.sample(train_pool, min(k, len))` of the
    user's train rows as they come, repeats included. Returns {test conversation id: sampled prompts}."""
    import random

    random.seed(seed)
    out = {}
    for user in sorted({r["user_id"] for r in rows}):
        pool = [r["context"][0]["content"] for r in rows if r["user_id"] == user and r["split"] == "train"]
        for r in (r for r in rows if r["user_id"] == user and r["split"] == "test"):
            out[r["conversation_id"]] = random.sample(pool, min(k, len(pool)))
    return out


@pytest.mark.django_db
def test_release_history_sampling_samples_the_raw_pool_and_the_import_counts_repeats(tmp_path, capsys):
    """Fault 5: one repeated train row; the release's draw equals ours under history_sampling release and
    differs from ours under prbench (which keeps the repeated row once and says how many it removed)."""
    rows = [prb_row(0, i, "train") for i in range(6)] + [{**prb_row(0, 2, "train"), "conversation_id": "again"}]
    rows += [prb_row(0, i, "test") for i in range(6, 18)] + [prb_row(1, i, "train") for i in range(4)]
    rows += [prb_row(1, i, "test") for i in range(4, 8)]
    folder = write_prb(tmp_path, rows)
    expected = release_histories(rows, k=3)

    def histories(sampling):
        return {r.source_id: [h["prompt"] for h in r.history]
                for r in read_records(folder, history_size=3, history_sampling=sampling) if r.split == "test"}

    released, ours = histories("release"), histories("prbench")
    changed = sum(released[i] != ours[i] for i in expected)
    assert released == expected
    assert changed > 0
    call_command("import_benchmark", str(folder), "--name", "prism-raw", "--history-size", "3",
                 "--history-sampling", "release")
    call_command("import_benchmark", str(folder), "--name", "prism-ours", "--history-size", "3")
    out = capsys.readouterr().out
    assert ("history: 0 repeated train row(s) removed before sampling (history sampling release: the raw pool, as "
            "the authors' release)") in out
    assert "history: 1 repeated train row(s) removed before sampling (history sampling prbench)" in out
    with pytest.raises(CommandError, match="invalid choice: 'raw'"):
        call_command("import_benchmark", str(folder), "--name", "x", "--history-sampling", "raw")
    with capsys.disabled():
        print(f"\nPROTOCOL | pgenrm histories (k=3, one repeated train row) | release rule (independent) = ours "
              f"history_sampling=release: {released == expected} | prbench differs in {changed} of {len(expected)}")
