"""The benchmark file readers and writers (plain Python, no database)."""

import json
import tracemalloc
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline import domains
from pipeline.formats import FormatError, list_source_files, read_records, write_rows

SAMPLE = Path(__file__).resolve().parents[2] / "pipeline" / "sample_data"


def make_row(i: int, **overrides) -> dict:
    row = {
        "id": f"u{i}",
        "question": f"How do I get better at painting landscapes, question {i}?",
        "profile": [
            {"id": f"u{i}-p{j}", "text": f"I painted with watercolours on day {j}.", "category": "Art_and_Entertainment"}
            for j in range(3)
        ],
        "rubric_aspects": [{"aspect": "Mentions watercolour", "evidence": "paints in watercolour", "reason": "medium"}],
        "narrative": "Wants medium-specific tips.",
        "category": "Art_and_Entertainment",
        "chosen": "Practise wet-on-wet washes with watercolour.",
        "rejected": "Practise painting regularly.",
    }
    row.update(overrides)
    return row


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def error_of(path: Path) -> FormatError:
    with pytest.raises(FormatError) as info:
        list(read_records(path))
    return info.value


def test_jsonl_rows_become_records_in_order(tmp_path):
    path = write_jsonl(tmp_path / "b.jsonl", [make_row(1), make_row(2)])
    records = list(read_records(path))
    assert [r.source_id for r in records] == ["u1", "u2"]
    assert [r.position for r in records] == [0, 1]
    assert records[0].domain == domains.ARTS
    assert records[0].profile[2] == {"id": "u1-p2", "text": "I painted with watercolours on day 2.",
                                     "category": "Art_and_Entertainment"}


def test_a_missing_field_is_named_with_file_and_line(tmp_path):
    row = make_row(2)
    del row["question"]
    path = write_jsonl(tmp_path / "b.jsonl", [make_row(1), row])
    err = error_of(path)
    assert (err.file, err.line, err.field) == (path, 2, "question")
    assert str(err) == f"{path}, line 2, field 'question': missing field"


@pytest.mark.parametrize("field,value,expected", [
    ("question", 42, "expected a string, got a number"),
    ("profile", "my posts", "expected a list, got a string"),
    ("rubric_aspects", {"aspect": "x"}, "expected a list, got an object"),
    ("chosen", "   ", "must not be empty"),
    ("rejected", "", "must not be empty"),
    ("id", True, "expected a string or an integer, got a boolean"),
    ("category", "Cooking", "unknown category 'Cooking'"),
])
def test_a_wrong_value_is_named_with_its_field(tmp_path, field, value, expected):
    path = write_jsonl(tmp_path / "b.jsonl", [make_row(1, **{field: value})])
    err = error_of(path)
    assert err.field == field and err.line == 1
    assert expected in err.reason


def test_nested_problems_name_the_element(tmp_path):
    row = make_row(1)
    row["profile"][1] = {"id": "p", "text": 5}
    err = error_of(write_jsonl(tmp_path / "b.jsonl", [row]))
    assert err.field == "profile[1].text" and "expected a string" in err.reason

    row = make_row(1)
    row["profile"][0] = "just text"
    err = error_of(write_jsonl(tmp_path / "c.jsonl", [row]))
    assert err.field == "profile[0]" and "expected an object" in err.reason


def test_chosen_identical_to_rejected_is_refused(tmp_path):
    path = write_jsonl(tmp_path / "b.jsonl", [make_row(1, chosen="Same answer.", rejected=" Same answer.\n")])
    err = error_of(path)
    assert err.field == "rejected" and "identical" in err.reason


def test_a_duplicate_id_names_both_places(tmp_path):
    path = write_jsonl(tmp_path / "b.jsonl", [make_row(1), make_row(2), make_row(1)])
    err = error_of(path)
    assert (err.line, err.field) == (3, "id")
    assert "duplicate id 'u1'" in err.reason and "line 1" in err.reason


def test_invalid_utf8_names_the_line(tmp_path):
    path = tmp_path / "b.jsonl"
    good = json.dumps(make_row(1)).encode()
    bad = json.dumps(make_row(2)).encode().replace(b"landscapes", b"landsc\xffapes")
    path.write_bytes(good + b"\n" + bad + b"\n")
    err = error_of(path)
    assert err.line == 2 and "invalid UTF-8" in err.reason


def test_invalid_utf8_in_a_json_array_names_the_line(tmp_path):
    path = tmp_path / "b.json"
    text = json.dumps([make_row(1), make_row(2)], indent=1).encode()
    bad_at = text.rindex(b"landscapes")  # inside the second row
    path.write_bytes(text[:bad_at] + b"\xc3\x28" + text[bad_at:])
    err = error_of(path)
    assert err.line == text[:bad_at].count(b"\n") + 1 and "invalid UTF-8" in err.reason


def test_a_truncated_jsonl_file_is_reported_as_truncated(tmp_path):
    path = tmp_path / "b.jsonl"
    body = "".join(json.dumps(make_row(i)) + "\n" for i in range(3))
    path.write_text(body[: len(body) - 40], encoding="utf-8")
    err = error_of(path)
    assert err.line == 3 and "truncated" in err.reason


def test_a_truncated_json_array_is_reported_as_truncated(tmp_path):
    path = tmp_path / "b.json"
    body = json.dumps([make_row(i) for i in range(3)], indent=2)
    path.write_text(body[: len(body) - 200], encoding="utf-8")
    err = error_of(path)
    assert "truncated" in err.reason and err.line is not None


def test_a_truncated_parquet_file_is_refused_with_its_name(tmp_path):
    good = tmp_path / "good.parquet"
    pq.write_table(pa.Table.from_pylist([make_row(i) for i in range(5)]), good)
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(good.read_bytes()[:-30])
    err = error_of(bad)
    assert err.file == bad and "Parquet" in err.reason


def test_json_arrays_stream_with_line_numbers(tmp_path):
    path = tmp_path / "b.json"
    rows = [make_row(1), make_row(2), make_row(3, question=None)]
    path.write_text(json.dumps(rows, indent=2), encoding="utf-8")
    err = error_of(path)
    text = path.read_text()
    third_line = text[: text.index('"id": "u3"')].count("\n")  # the line of the '{' before it
    assert err.line == third_line and err.field == "question"


def test_a_json_file_may_hold_json_lines(tmp_path):
    path = write_jsonl(tmp_path / "b.json", [make_row(1), make_row(2)])
    assert [r.source_id for r in read_records(path)] == ["u1", "u2"]


def test_parquet_rows_are_numbered_as_rows(tmp_path):
    path = tmp_path / "b.parquet"
    pq.write_table(pa.Table.from_pylist([make_row(1), make_row(2, chosen="")]), path)
    err = error_of(path)
    assert (err.unit, err.line, err.field) == ("row", 2, "chosen")
    assert "row 2" in str(err)


def test_folder_subsets_give_the_domain_when_category_is_missing(tmp_path):
    for subset in ("Lifestyle_and_Personal_Development", "Society_and_Culture"):
        (tmp_path / subset).mkdir()
        row = make_row(len(subset))
        del row["category"]
        write_jsonl(tmp_path / subset / "test.jsonl", [row])
    (tmp_path / "metadata.json").write_text('{"synthetic": true}')
    records = list(read_records(tmp_path))
    assert [r.domain for r in records] == [domains.LIFESTYLE, domains.SOCIETY]
    assert [r.category for r in records] == ["Lifestyle_and_Personal_Development", "Society_and_Culture"]


def test_a_row_without_category_outside_a_subset_folder_is_refused(tmp_path):
    row = make_row(1)
    del row["category"]
    err = error_of(write_jsonl(tmp_path / "b.jsonl", [row]))
    assert err.field == "category" and err.reason == "missing field"


def test_lamp_qa_rows_need_no_answers():
    # LaMP-QA rows are the same schema without chosen/rejected.
    row = make_row(1)
    del row["chosen"], row["rejected"]
    from pipeline.formats import validate_row

    record = validate_row(row, file=Path("x.jsonl"), line=1, position=0, subset_domain=None, require_pair=False)
    assert record.chosen is None and "chosen" not in record.to_row()


@pytest.mark.parametrize("suffix", [".jsonl", ".json"])
def test_writing_then_reading_gives_back_the_rows(tmp_path, suffix):
    rows = [make_row(1, extra_field={"a": 1}), make_row(2, id=7)]
    out = tmp_path / f"out{suffix}"
    assert write_rows(rows, out) == 2
    assert [r.to_row() for r in read_records(out)] == rows


def test_parquet_round_trips_rows_of_one_shape(tmp_path):
    rows = [make_row(i, id=i, extra_field={"a": i}) for i in range(600)]  # more than one write batch
    out = tmp_path / "out.parquet"
    assert write_rows(rows, out) == 600
    assert [r.to_row() for r in read_records(out)] == rows


def test_parquet_export_of_mixed_id_types_fails_cleanly(tmp_path):
    out = tmp_path / "out.parquet"
    with pytest.raises(FormatError, match="export as .jsonl"):
        write_rows([make_row(1), make_row(2, id=7)], out)
    assert list(tmp_path.iterdir()) == []  # no partial file left behind


def test_the_sample_benchmark_has_ten_items_per_domain():
    records = list(read_records(SAMPLE))
    assert len(records) == 30
    assert {d: sum(r.domain == d for r in records) for d in domains.LABELS} == {
        d: 10 if d in domains.LAMP_QA_DOMAINS else 0 for d in domains.LABELS}
    assert all(len(r.profile) >= 5 for r in records)


def test_the_sample_folder_lists_only_data_files():
    files = [f.name for f, _ in list_source_files(SAMPLE)]
    assert "metadata.json" not in files and len(files) == 3


def _peak_reading(path: Path) -> tuple[int, int]:
    tracemalloc.start()
    try:
        count = sum(1 for _ in read_records(path))
        return count, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("suffix", [".jsonl", ".json"])
def test_reading_memory_stays_flat_as_files_grow(tmp_path, suffix):
    peaks = {}
    for n in (2000, 8000):
        path = tmp_path / f"big{n}{suffix}"
        write_rows((make_row(i, narrative="x" * 2000) for i in range(n)), path)
        count, peaks[n] = _peak_reading(path)
        assert count == n
    size = path.stat().st_size
    assert size > 20_000_000
    # Four times the rows: the peak grows only by the seen-id index, never by the file.
    assert peaks[8000] < peaks[2000] * 1.3 + 1_000_000, peaks
    assert peaks[8000] < size / 4, peaks


# JSON arrays are streamed by ijson (its pure-Python backend); what the reader gave before is
# kept where the JSON is valid, and every bad file is one line naming file and line.

def test_a_json_array_streams_the_same_rows_and_lines_as_before(tmp_path):
    from pipeline.rowfiles import iter_raw_rows

    path = tmp_path / "a.json"
    path.write_bytes(b'\xef\xbb\xbf[\n {"a": 1,\n  "b": [1.5, "x", -0.0, 12345678901234567890123]},\n\n {"c": null}\n]\n')
    assert list(iter_raw_rows(path)) == [(2, {"a": 1, "b": [1.5, "x", -0.0, 12345678901234567890123]}, "line"),
                                         (5, {"c": None}, "line")]
    assert isinstance(list(iter_raw_rows(path))[0][1]["b"][0], float)  # floats, not Decimal


def test_a_lone_surrogate_in_a_json_array_is_refused_by_field_not_turned_into_a_question_mark(tmp_path):
    path = tmp_path / "b.json"
    rows = [make_row(1), make_row(2)]
    text = json.dumps(rows, indent=1).replace("question 2?", "question 2\\ud83d?")
    path.write_text(text, encoding="utf-8")
    err = error_of(path)
    assert err.field == "question" and "lone surrogate" in err.reason
    assert err.line == text[: text.index('"id": "u2"')].count("\n")


@pytest.mark.parametrize(("body", "line", "reason"), [
    (b'[\n{"a": ' + b"1" * 5000 + b"}]", 2, "invalid JSON: unexpected '" + "1" * 40 + "...'"),  # no crash
    (b'[\n{"a": 1},\n{"a" 2}\n]', 3, "invalid JSON: unexpected '2'"),
    (b'[{"a": 1}]\n x', 2, "unexpected data after the closing ']'"),
    (b'[\n{"a": 1},\n{"a": 2', 3, "file ends inside the array (truncated?)"),
    (b'[\n{"a": 1},\n{"a": "\xff"}]', 3, "invalid UTF-8"),
    (b'[{"a": NaN}]', 1, "invalid JSON: unexpected 'N'"),
])
def test_a_bad_json_array_is_one_line_naming_file_and_line(tmp_path, body, line, reason):
    from pipeline.rowfiles import iter_raw_rows

    path = tmp_path / "bad.json"
    path.write_bytes(body)
    with pytest.raises(FormatError) as info:
        list(iter_raw_rows(path))
    assert (info.value.line, info.value.reason) == (line, reason)
    assert str(info.value) == f"{path}, line {line}: {reason}"
