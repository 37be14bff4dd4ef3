"""Malformed files at every importer (issue 10, cases 1 and 2; issue 17, case 6): each either
imports or is refused whole with one line naming file, line and field; nothing is written; the
same on SQLite and PostgreSQL (run this file with DATABASE_URL set for the second)."""

import json

import pytest
from django.core.management import CommandError, call_command
from django.core.files.uploadedfile import SimpleUploadedFile
from hypothesis import HealthCheck, given, settings, strategies as st

from leaderboard import services
from leaderboard.models import DownstreamOutcome, ExternalBenchmarkScore
from pipeline.formats import CATEGORY_MAX, SOURCE_ID_MAX, USER_ID_MAX
from pipeline.models import Benchmark, BenchmarkItem
from pipeline.services import benchmark_import
from tests.pipeline.test_formats import SAMPLE, make_row

pytestmark = pytest.mark.django_db

OUTCOMES_CSV = "rm,domain,outcome,n,source,kind\nrm-a,all,1.5,30,paper,best_of_n\nrm-b,all,1.2,30,paper,best_of_n\n"
SCORES_JSON = '[{"benchmark": "RewardBench", "rm": "rm-a", "source": "paper", "accuracy": 71.5}]'
HALF = " (half of a character such as an emoji; not valid Unicode)"
FUZZ = settings(max_examples=60, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def windows(text: str) -> bytes:
    """The same content as a spreadsheet on Windows saves it: a BOM and CRLF line ends."""
    return b"\xef\xbb\xbf" + text.replace("\n", "\r\n").encode()


def refusal(*args) -> str:
    with pytest.raises(CommandError) as error:
        call_command(*args)
    return str(error.value)


# --- byte order marks and line ends (case 1) ----------------------------------------------------

def test_outcomes_and_benchmark_scores_read_a_bom_and_crlf_like_plain_text(tmp_path):
    (tmp_path / "out.csv").write_bytes(windows(OUTCOMES_CSV))
    (tmp_path / "scores.json").write_bytes(windows(SCORES_JSON))
    call_command("import_outcomes", str(tmp_path / "out.csv"))
    call_command("import_benchmark_scores", str(tmp_path / "scores.json"))
    assert sorted(DownstreamOutcome.objects.values_list("rm_name", "outcome", "n")) == [
        ("rm-a", 1.5, 30), ("rm-b", 1.2, 30)]
    assert list(ExternalBenchmarkScore.objects.values_list("benchmark", "rm_name", "accuracy")) == [
        ("RewardBench", "rm-a", 0.715)]


def test_a_bom_and_crlf_benchmark_is_the_same_content(tmp_path):
    rows = "".join(json.dumps(make_row(i)) + "\n" for i in range(3))
    (tmp_path / "plain.jsonl").write_text(rows)
    (tmp_path / "windows.jsonl").write_bytes(windows(rows))
    first = benchmark_import(path=tmp_path / "plain.jsonl", name="plain").benchmark
    with pytest.raises(Exception, match="the same content is already imported as benchmark 'plain'"):
        benchmark_import(path=tmp_path / "windows.jsonl", name="windows")
    assert first.item_count == 3 and Benchmark.objects.count() == 1


def test_a_crlf_copy_of_an_uploaded_scores_file_is_the_same_model(researcher):
    bench = benchmark_import(path=SAMPLE, name="sample").benchmark
    text = "".join(json.dumps({"id": i, "chosen_score": 1, "rejected_score": 0}) + "\n"
                   for i in bench.items.values_list("source_id", flat=True))

    def submit(data: bytes, name: str):
        return services.submission_create(user=researcher, request=services.SubmissionRequest(
            display_name=name, benchmark="sample", kind="scores", settings=("profile",),
            scores_file=SimpleUploadedFile("scores.jsonl", data)))

    submit(text.encode(), "up")
    with pytest.raises(services.SubmissionRefused, match="already evaluated on sample in the \"With profile\" setting"):
        submit(windows(text), "up again")


# --- invalid Unicode, NUL and over-long values (case 2; issue 17, case 6) ----------------------

@pytest.mark.parametrize("field, value, reason", [
    ("question", "Half an emoji \ud83c", "contains a lone surrogate '\\ud83c' at character 15" + HALF),
    ("narrative", "a\x00b", "contains a NUL character (at character 2), which cannot be stored"),
    ("chosen", "\udfff", "contains a lone surrogate '\\udfff' at character 1" + HALF),
])
def test_lone_surrogates_and_nul_are_refused_naming_file_line_and_field(tmp_path, field, value, reason):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(make_row(1)) + "\n" + json.dumps(make_row(2, **{field: value})) + "\n")
    assert refusal("import_benchmark", str(path), "--name", "bad") == f"{path}, line 2, field '{field}': {reason}"
    assert not Benchmark.objects.exists() and not BenchmarkItem.objects.exists()


def test_a_surrogate_inside_a_profile_post_or_an_extra_key_is_named_by_its_path(tmp_path):
    row = make_row(1)
    row["profile"][1]["text"] = "x\ud83d"
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(row) + "\n")
    assert refusal("import_benchmark", str(path), "--name", "bad").endswith(
        "line 1, field 'profile[1].text': contains a lone surrogate '\\ud83d' at character 2 "
        "(half of a character such as an emoji; not valid Unicode)")
    path.write_text(json.dumps(make_row(1, source={"note": "\x00"})) + "\n")
    assert "field 'source.note': contains a NUL character" in refusal("import_benchmark", str(path), "--name", "b")


@pytest.mark.parametrize("field, length", [("id", SOURCE_ID_MAX + 1), ("category", CATEGORY_MAX + 1)])
def test_over_long_values_for_bounded_columns_are_refused_with_line_and_field(tmp_path, field, length):
    path = tmp_path / "long.jsonl"
    path.write_text(json.dumps(make_row(1, **{field: "x" * length})) + "\n")
    message = refusal("import_benchmark", str(path), "--name", "long")
    what = "an id holds" if field == "id" else "this field holds"
    assert message == f"{path}, line 1, field '{field}': {length} characters, more than the {length - 1} {what}"
    assert not Benchmark.objects.exists()


def test_over_long_and_bad_outcome_rows_are_refused_whole(tmp_path):
    path = tmp_path / "out.csv"
    path.write_text(OUTCOMES_CSV + f"{'r' * 121},all,1.0,30,paper,best_of_n\n")
    assert refusal("import_outcomes", str(path)) == (
        "out.csv, line 4, field 'rm': 121 characters, more than the 120 this field holds")
    path.write_text(OUTCOMES_CSV + "rm-c,all,1.0," + "9" * 400 + ",paper,best_of_n\n")
    assert refusal("import_outcomes", str(path)) == "out.csv, line 4, field 'n': a 400-digit number is out of range"
    path.write_text(OUTCOMES_CSV + "rm-c,all,nan,3,paper,best_of_n\n")
    assert refusal("import_outcomes", str(path)) == "out.csv, line 4, field 'outcome': must be a finite number, not nan"
    path.write_text(OUTCOMES_CSV + "rm-c,all,1.0,3,pa\x00per,best_of_n\n")
    assert refusal("import_outcomes", str(path)).startswith("out.csv, line 4, field 'source': contains a NUL")
    path.write_bytes(OUTCOMES_CSV.encode() + b"rm-c,all,1.0,3,caf\xe9,best_of_n\n")
    assert refusal("import_outcomes", str(path)) == "out.csv, line 4: invalid UTF-8 (byte 19 of the line)"
    assert not DownstreamOutcome.objects.exists()
    path = tmp_path / "scores.jsonl"
    path.write_text('{"benchmark": "RB", "rm": "a", "accuracy": 0.5}\n{"benchmark": "RB", "rm": "b", "accuracy": 101}\n')
    assert refusal("import_benchmark_scores", str(path)) == "scores.jsonl, line 2, field 'accuracy': must be at most 100"
    assert not ExternalBenchmarkScore.objects.exists()


def test_the_row_bounds_are_the_columns_bounds():
    from leaderboard.models import DownstreamOutcome as D, ExternalBenchmarkScore as E
    from leaderboard.services import BenchmarkScoreRow, OutcomeRow

    assert (SOURCE_ID_MAX, CATEGORY_MAX, USER_ID_MAX) == tuple(
        BenchmarkItem._meta.get_field(f).max_length for f in ("source_id", "category", "user_id"))
    for row_field, column in (("rm", "rm_name"), ("policy", "policy"), ("domain", "domain"), ("source", "source"),
                              ("kind", "kind")):
        assert _declared(OutcomeRow, row_field) == D._meta.get_field(column).max_length, row_field
    for row_field, column in (("benchmark", "benchmark"), ("rm", "rm_name"), ("setting", "setting"),
                              ("source", "source")):
        assert _declared(BenchmarkScoreRow, row_field) == E._meta.get_field(column).max_length, row_field


def _declared(model, name: str) -> int:
    """The length bound a row model enforces, found by trying it."""
    from prblib.rows import RowError, validate

    base = {"rm": "r", "outcome": 1, "n": 1, "source": "s", "benchmark": "b", "accuracy": 0.5}
    for length in range(1, 1000):
        try:
            validate(model, {**base, name: "x" * length})
        except RowError as exc:
            assert exc.field == name
            return length - 1
    raise AssertionError("unbounded")


# --- property tests: arbitrary bytes and JSON never give a traceback or a partial write ----------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12)


def _row_like(draw_value):
    return st.fixed_dictionaries({}, optional={
        key: draw_value for key in ("id", "question", "profile", "rubric_aspects", "narrative", "category",
                                    "chosen", "rejected", "history", "user_id")})


@FUZZ
@given(data=st.binary(max_size=400) | st.lists(_row_like(json_values), max_size=3).map(
    lambda rows: "\n".join(json.dumps(r) for r in rows).encode()))
def test_import_benchmark_imports_or_refuses_with_one_line(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("fuzz") / "rows.jsonl"
    path.write_bytes(data)
    before = BenchmarkItem.objects.count()
    try:
        call_command("import_benchmark", str(path), "--name", "fuzz")
    except CommandError as exc:
        assert "\n" not in str(exc) and str(exc).startswith(str(path))
        assert BenchmarkItem.objects.count() == before
    else:
        Benchmark.objects.filter(name="fuzz").delete()


@FUZZ
@given(data=st.binary(max_size=300) | st.lists(st.dictionaries(
    st.sampled_from(["rm", "domain", "outcome", "n", "source", "kind", "k", "policy", "benchmark", "accuracy"]),
    json_values), max_size=3).map(lambda rows: json.dumps(rows).encode()),
    command=st.sampled_from(["import_outcomes", "import_benchmark_scores"]), suffix=st.sampled_from([".json", ".csv"]))
def test_table_importers_import_or_refuse_with_one_line(tmp_path_factory, data, command, suffix):
    path = tmp_path_factory.mktemp("fuzz") / f"rows{suffix}"
    path.write_bytes(data)
    before = (DownstreamOutcome.objects.count(), ExternalBenchmarkScore.objects.count())
    try:
        call_command(command, str(path))
    except CommandError as exc:
        assert "\n" not in str(exc) and str(exc).startswith(path.name)
        assert (DownstreamOutcome.objects.count(), ExternalBenchmarkScore.objects.count()) == before


@FUZZ
@given(data=st.binary(max_size=300) | st.lists(st.dictionaries(
    st.sampled_from(["id", "chosen_score", "rejected_score"]), json_values), max_size=3).map(
    lambda rows: "\n".join(json.dumps(r) for r in rows).encode()))
def test_the_scores_reader_accepts_or_refuses_with_one_line(tmp_path_factory, data):
    from prblib.errors import ModelError
    from prblib.rewards.scores import parse_scores_file

    path = tmp_path_factory.mktemp("fuzz") / "up.jsonl"
    path.write_bytes(data)
    try:
        parse_scores_file(path, {"a", "1"})
    except ModelError as exc:
        assert "\n" not in str(exc) and str(exc).startswith("scores file up.jsonl")


@FUZZ
@given(data=st.binary(max_size=300) | json_values.map(lambda v: json.dumps(v).encode()))
def test_the_prototypes_reader_loads_or_refuses_with_one_line(tmp_path_factory, data):
    from prblib.errors import ModelError
    from prblib.rewards.pgenrm.model import _load_prototypes

    path = tmp_path_factory.mktemp("fuzz") / "protos.json"
    path.write_bytes(data)
    try:
        _load_prototypes(str(path))
    except ModelError as exc:
        assert "\n" not in str(exc)


def test_a_lamp_qa_source_row_is_checked_by_the_same_rules(tmp_path):
    from pipeline.formats import FormatError, read_records

    row = make_row(1, question="x\ud83c")
    del row["chosen"], row["rejected"]
    path = tmp_path / "lamp.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + (json.dumps(make_row(0)) + "\r\n" + json.dumps(row) + "\r\n").encode())
    with pytest.raises(FormatError) as error:
        list(read_records(path, require_pair=False))
    assert str(error.value) == f"{path}, line 2, field 'question': contains a lone surrogate '\\ud83c' at character 2" + HALF
