"""import_benchmark / export_benchmark: all-or-nothing imports, no-op re-imports, exact round trips."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from django.core.management import CommandError, call_command

from pipeline.formats import read_records
from pipeline.models import Benchmark, BenchmarkItem
from pipeline.services import BenchmarkError, benchmark_freeze, benchmark_import
from tests.conftest import BASE_DIR, subprocess_env
from tests.pipeline.test_formats import SAMPLE, make_row, write_jsonl

pytestmark = pytest.mark.django_db


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def sample_rows() -> list[dict]:
    rows = []
    for subset_file in sorted(SAMPLE.rglob("*.jsonl")):
        rows.extend(read_jsonl(subset_file))
    return rows


def assert_nothing_written():
    assert Benchmark.objects.count() == 0
    assert BenchmarkItem.objects.count() == 0


def test_importing_the_sample_folder_stores_every_item_with_its_metadata(capsys):
    call_command("import_benchmark", str(SAMPLE), "--name", "sample")
    bench = Benchmark.objects.get(name="sample")
    assert bench.item_count == 30 == bench.items.count()
    assert bench.is_synthetic and bench.metadata["synthetic"] is True
    assert len(bench.content_hash) == 64
    assert bench.stats["overall"]["items"] == 30
    assert "imported 30 items as benchmark 'sample'" in capsys.readouterr().out


def test_export_of_an_import_gives_back_the_same_rows(tmp_path):
    call_command("import_benchmark", str(SAMPLE), "--name", "sample")
    out = tmp_path / "out.jsonl"
    call_command("export_benchmark", "--name", "sample", "--out", str(out))
    assert read_jsonl(out) == sample_rows()


@pytest.mark.parametrize("suffix", [".json", ".parquet"])
def test_export_to_json_and_parquet_reimports_to_the_same_content(tmp_path, suffix):
    call_command("import_benchmark", str(SAMPLE), "--name", "sample")
    out = tmp_path / f"out{suffix}"
    call_command("export_benchmark", "--name", "sample", "--out", str(out))
    assert [r.to_row() for r in read_records(out)] == sample_rows()
    # Same content under the same name: recognised as identical whatever the format.
    call_command("import_benchmark", str(out), "--name", "sample")
    assert Benchmark.objects.count() == 1


def test_a_single_jsonl_file_round_trips_with_integer_ids_and_extra_fields(tmp_path):
    rows = [make_row(1, id=101, source_url="https://example.org/q/1"), make_row(2, id=102)]
    src = write_jsonl(tmp_path / "in.jsonl", rows)
    call_command("import_benchmark", str(src), "--name", "tiny")
    out = tmp_path / "out.jsonl"
    call_command("export_benchmark", "--name", "tiny", "--out", str(out))
    assert read_jsonl(out) == rows


def test_reimporting_identical_content_is_a_no_op(tmp_path, capsys):
    call_command("import_benchmark", str(SAMPLE), "--name", "sample")
    before = list(BenchmarkItem.objects.order_by("pk").values_list("pk", flat=True))
    # The same rows in one JSONL file instead of the subset folders.
    src = write_jsonl(tmp_path / "same.jsonl", sample_rows())
    call_command("import_benchmark", str(src), "--name", "sample")
    assert "nothing changed" in capsys.readouterr().out
    assert list(BenchmarkItem.objects.order_by("pk").values_list("pk", flat=True)) == before


def test_the_same_name_with_different_content_is_refused(tmp_path):
    call_command("import_benchmark", str(write_jsonl(tmp_path / "a.jsonl", [make_row(1)])), "--name", "b1")
    changed = write_jsonl(tmp_path / "b.jsonl", [make_row(1, chosen="A different chosen answer.")])
    with pytest.raises(CommandError, match="already exists with different content"):
        call_command("import_benchmark", str(changed), "--name", "b1")
    assert BenchmarkItem.objects.get().chosen == make_row(1)["chosen"]


def test_the_same_content_under_another_name_is_refused(tmp_path):
    src = write_jsonl(tmp_path / "a.jsonl", [make_row(1)])
    call_command("import_benchmark", str(src), "--name", "first")
    with pytest.raises(CommandError, match="already imported as benchmark 'first'"):
        call_command("import_benchmark", str(src), "--name", "second")
    assert list(Benchmark.objects.values_list("name", flat=True)) == ["first"]


def test_a_bad_row_late_in_a_large_file_writes_nothing(tmp_path):
    rows = [make_row(i) for i in range(1200)]  # more than two insert batches before the bad row
    rows.append(make_row(5000, rejected=""))
    src = write_jsonl(tmp_path / "big.jsonl", rows)
    with pytest.raises(CommandError) as info:
        call_command("import_benchmark", str(src), "--name", "big")
    assert str(info.value) == f"{src}, line 1201, field 'rejected': must not be empty"
    assert_nothing_written()


def test_a_bad_file_in_a_folder_rejects_the_whole_folder(tmp_path):
    folder = tmp_path / "data"
    shutil.copytree(SAMPLE, folder)
    broken = folder / "Society_and_Culture" / "test.jsonl"
    lines = broken.read_text(encoding="utf-8").splitlines()
    row = json.loads(lines[4])
    row["profile"] = "not a list"
    lines[4] = json.dumps(row)
    broken.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(CommandError, match=r"Society_and_Culture/test.jsonl, line 5, field 'profile': expected a list"):
        call_command("import_benchmark", str(folder), "--name", "broken")
    assert_nothing_written()


@pytest.mark.parametrize("mutate,expected", [
    (lambda rows: rows[1].pop("chosen"), "line 2, field 'chosen': missing field"),
    (lambda rows: rows[0].update(question=["not", "text"]), "line 1, field 'question': expected a string, got a list"),
    (lambda rows: rows[2].update(chosen=rows[2]["rejected"]), "line 3, field 'rejected': chosen and rejected are identical"),
    (lambda rows: rows[2].update(id=rows[0]["id"]), "line 3, field 'id': duplicate id 'u0'"),
    (lambda rows: rows[1].update(profile={"id": 1, "text": "x"}), "line 2, field 'profile': expected a list, got an object"),
])
def test_each_kind_of_bad_row_is_named_and_nothing_is_written(tmp_path, mutate, expected):
    rows = [make_row(i) for i in range(3)]
    mutate(rows)
    src = write_jsonl(tmp_path / "in.jsonl", rows)
    with pytest.raises(CommandError, match=expected.replace("(", r"\(").replace(")", r"\)")):
        call_command("import_benchmark", str(src), "--name", "bad")
    assert_nothing_written()


def test_invalid_utf8_and_truncated_files_write_nothing(tmp_path):
    bad_bytes = tmp_path / "utf.jsonl"
    bad_bytes.write_bytes(json.dumps(make_row(1)).encode() + b"\n" + b'{"id": "\xff"}\n')
    with pytest.raises(CommandError, match="line 2: invalid UTF-8"):
        call_command("import_benchmark", str(bad_bytes), "--name", "utf")

    good = tmp_path / "good.parquet"
    pq.write_table(pa.Table.from_pylist([make_row(i) for i in range(3)]), good)
    truncated = tmp_path / "cut.parquet"
    truncated.write_bytes(good.read_bytes()[:-12])
    with pytest.raises(CommandError, match="cut.parquet: not a readable Parquet file"):
        call_command("import_benchmark", str(truncated), "--name", "cut")
    assert_nothing_written()


def test_an_empty_file_and_a_bad_name_are_refused(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(CommandError, match="no rows found"):
        call_command("import_benchmark", str(empty), "--name", "empty")
    with pytest.raises(CommandError, match="--name 'has space'"):
        call_command("import_benchmark", str(SAMPLE), "--name", "has space")
    with pytest.raises(CommandError, match="no such file or folder"):
        call_command("import_benchmark", str(tmp_path / "missing.jsonl"), "--name", "missing")
    assert_nothing_written()


def test_export_errors_are_clear(tmp_path):
    with pytest.raises(CommandError, match="no benchmark named 'nope'"):
        call_command("export_benchmark", "--name", "nope", "--out", str(tmp_path / "x.jsonl"))
    call_command("import_benchmark", str(SAMPLE), "--name", "sample")
    with pytest.raises(CommandError, match="unsupported output type '.csv'"):
        call_command("export_benchmark", "--name", "sample", "--out", str(tmp_path / "x.csv"))
    with pytest.raises(CommandError, match="no human validation yet"):
        call_command("export_benchmark", "--name", "sample", "--out", str(tmp_path / "x.jsonl"), "--validated-only")
    assert list(tmp_path.iterdir()) == []


def test_freezing_is_idempotent():
    result = benchmark_import(path=SAMPLE, name="sample")
    assert benchmark_freeze(benchmark=result.benchmark) is True
    assert benchmark_freeze(benchmark=result.benchmark) is False
    assert result.benchmark.is_frozen


def test_importing_twice_under_a_race_cannot_duplicate_items(tmp_path):
    # The database itself refuses a second item with the same source id in a benchmark.
    from django.db import IntegrityError, transaction

    result = benchmark_import(path=SAMPLE, name="sample")
    item = result.benchmark.items.first()
    with pytest.raises(IntegrityError), transaction.atomic():
        BenchmarkItem.objects.create(benchmark=item.benchmark, position=999, source_id=item.source_id,
                                     domain=item.domain, category=item.category, question="q", chosen="a",
                                     rejected="b")
    with pytest.raises(BenchmarkError):
        benchmark_import(path=write_jsonl(tmp_path / "x.jsonl", [make_row(1, chosen="zzz")]), name="sample")


@pytest.mark.django_db(transaction=True)
def test_the_command_line_exits_non_zero_with_one_clear_line(tmp_path):
    rows = [make_row(1), make_row(2)]
    del rows[1]["narrative"]
    src = write_jsonl(tmp_path / "in.jsonl", rows)
    proc = subprocess.run([sys.executable, "manage.py", "import_benchmark", str(src), "--name", "cli", "-v", "0"],
                          cwd=BASE_DIR, env=subprocess_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines() == [f"CommandError: {src}, line 2, field 'narrative': missing field"]
    assert_nothing_written()
