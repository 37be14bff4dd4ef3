"""Uploaded scores files: read exactly, refused loudly (file and line), all-or-nothing."""

import json

import pytest

from prblib.rewards.base import ModelSpec, PairInput, load_reward_model
from prblib.errors import ModelError
from prblib.rewards.scores import UploadedScores, parse_scores_file

IDS = {"a", "b", "c"}


def pair(pair_id: str) -> PairInput:
    return PairInput(id=pair_id, domain="Arts", question="q", chosen="c", rejected="r")


def write(tmp_path, lines, name="scores.jsonl"):
    path = tmp_path / name
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    return path


GOOD = [{"id": "a", "chosen_score": 1.5, "rejected_score": -2},
        {"id": "b", "chosen_score": 0, "rejected_score": 0, "domain": "Arts", "correct": False},
        {"id": "c", "chosen_score": 3, "rejected_score": 7.25}]


def test_a_good_file_is_read_into_floats(tmp_path):
    scores = parse_scores_file(write(tmp_path, GOOD), IDS)
    assert scores == {"a": (1.5, -2.0), "b": (0.0, 0.0), "c": (3.0, 7.25)}
    assert all(isinstance(v, float) for pair_scores in scores.values() for v in pair_scores)


def test_blank_lines_and_a_byte_order_mark_are_fine(tmp_path):
    path = tmp_path / "s.jsonl"
    path.write_text("\ufeff" + "\n\n".join(json.dumps(row) for row in GOOD) + "\n\n", encoding="utf-8")
    assert set(parse_scores_file(path, IDS)) == IDS


@pytest.mark.parametrize("bad_line, message", [
    ("{not json", "line 2: not valid JSON"),
    ('["b", 1, 2]', "line 2: expected a JSON object, got a list"),
    ('{"chosen_score": 1, "rejected_score": 2}', "line 2, field 'id': missing field"),
    ('{"id": "b", "rejected_score": 2}', "line 2, field 'chosen_score': missing field"),
    ('{"id": "b", "chosen_score": 2}', "line 2, field 'rejected_score': missing field"),
    ('{"id": "b", "chosen_score": "0.5", "rejected_score": 2}', "line 2, field 'chosen_score': expected a number, got a string"),
    ('{"id": "b", "chosen_score": 1, "rejected_score": null}', "line 2, field 'rejected_score': missing field"),
    ('{"id": "b", "chosen_score": true, "rejected_score": 0}', "line 2, field 'chosen_score': expected a number, got a boolean"),
    ('{"id": "b", "chosen_score": NaN, "rejected_score": 0}', "line 2, field 'chosen_score': must be a finite number, not nan"),
    ('{"id": "b", "chosen_score": 1, "rejected_score": Infinity}',
     "line 2, field 'rejected_score': must be a finite number, not inf"),
    ('{"id": "b", "chosen_score": -Infinity, "rejected_score": 0}', "line 2, field 'chosen_score': must be a finite number"),
    ('{"id": "b", "chosen_score": 1' + "0" * 400 + ', "rejected_score": 0}',
     "line 2, field 'chosen_score': a 401-digit number is out of range"),
    ('{"id": "", "chosen_score": 1, "rejected_score": 0}', "line 2, field 'id': must not be empty"),
    ('{"id": "b\\ud83c", "chosen_score": 1, "rejected_score": 0}', "line 2, field 'id': contains a lone surrogate"),
    ('{"id": "b\\u0000", "chosen_score": 1, "rejected_score": 0}', "line 2, field 'id': contains a NUL character"),
    ('{"id": "a", "chosen_score": 1, "rejected_score": 0}', "line 2, field 'id': 'a' appears again (first on line 1)"),
    ('{"id": "zzz", "chosen_score": 1, "rejected_score": 0}', "line 2, field 'id': 'zzz' is not a pair of this benchmark"),
])
def test_a_bad_line_is_refused_naming_the_file_and_the_line(tmp_path, bad_line, message):
    path = write(tmp_path, [GOOD[0], bad_line, GOOD[2]], name="upload-42.jsonl")
    with pytest.raises(ModelError) as error:
        parse_scores_file(path, IDS)
    assert str(error.value).startswith("scores file upload-42.jsonl, " + message)


def test_missing_pairs_are_named_up_to_five_with_the_count(tmp_path):
    ids = {f"id{i:02d}" for i in range(10)}
    path = write(tmp_path, [{"id": "id00", "chosen_score": 1, "rejected_score": 0},
                            {"id": "id05", "chosen_score": 1, "rejected_score": 0}])
    with pytest.raises(ModelError) as error:
        parse_scores_file(path, ids)
    assert str(error.value) == ("scores file scores.jsonl has no scores for 8 pair(s) of this benchmark: "
                                "'id01', 'id02', 'id03', 'id04', 'id06' and 3 more")


def test_an_empty_file_misses_every_pair(tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_text("")
    with pytest.raises(ModelError, match=r"empty.jsonl has no scores for 3 pair\(s\)"):
        parse_scores_file(path, IDS)


def test_numeric_ids_are_matched_as_strings(tmp_path):
    path = write(tmp_path, [{"id": 7, "chosen_score": 1, "rejected_score": 0}])
    assert parse_scores_file(path, {"7"}) == {"7": (1.0, 0.0)}


def test_a_file_that_is_not_utf8_is_refused(tmp_path):
    path = tmp_path / "latin1.jsonl"
    path.write_bytes('{"id": "caf\xe9", "chosen_score": 1, "rejected_score": 0}\n'.encode("latin-1"))
    with pytest.raises(ModelError, match=r"^scores file latin1.jsonl, line 1: invalid UTF-8 \(byte 12 of the line\)$"):
        parse_scores_file(path, {"café"})


def test_a_bom_and_crlf_line_ends_read_as_the_same_content(tmp_path):
    plain = write(tmp_path, GOOD, name="plain.jsonl")
    windows = tmp_path / "windows.jsonl"
    windows.write_bytes(b"\xef\xbb\xbf" + plain.read_bytes().replace(b"\n", b"\r\n"))
    assert parse_scores_file(windows, IDS) == parse_scores_file(plain, IDS)


def test_the_registry_loads_uploaded_scores_and_yields_them(tmp_path):
    model = load_reward_model(ModelSpec(kind="scores", path=str(write(tmp_path, GOOD))))
    assert isinstance(model, UploadedScores)
    calls = []
    results = {r.id: r for r in model.score_pairs([pair("a"), pair("b"), pair("c")], setting="plan",
                                                  progress=calls.append)}
    assert calls == [1, 1, 1]
    assert (results["a"].chosen_score, results["a"].rejected_score) == (1.5, -2.0) and results["a"].correct
    assert results["b"].tie and not results["b"].correct
    assert not results["c"].correct
    assert model.render_inputs(pair("a"), setting="profile") == ("", "")


def test_scoring_is_all_or_nothing(tmp_path):
    path = write(tmp_path, [GOOD[0], GOOD[1], {"id": "c", "chosen_score": "high", "rejected_score": 0}])
    model = UploadedScores.load(ModelSpec(kind="scores", path=str(path)))
    yielded = []
    with pytest.raises(ModelError, match="line 3"):
        for result in model.score_pairs([pair("a"), pair("b"), pair("c")], setting="profile"):
            yielded.append(result)
    assert yielded == []


def test_the_file_is_checked_against_the_pairs_scored_unless_the_benchmark_ids_are_given(tmp_path):
    path = write(tmp_path, GOOD)
    subset = [pair("a"), pair("b")]
    with pytest.raises(ModelError, match="'c' is not a pair of this benchmark"):
        list(UploadedScores.load(ModelSpec(kind="scores", path=str(path))).score_pairs(subset, setting="profile"))
    model = UploadedScores.load(ModelSpec(kind="scores", path=str(path), runtime={"benchmark_ids": ["a", "b", "c"]}))
    assert sorted(r.id for r in model.score_pairs(subset, setting="profile")) == ["a", "b"]


def test_a_missing_file_or_unknown_option_is_refused(tmp_path):
    with pytest.raises(ModelError, match="does not exist"):
        UploadedScores.load(ModelSpec(kind="scores", path=str(tmp_path / "nope.jsonl")))
    with pytest.raises(ModelError, match="option 'scale' is not an option of the scores kind"):
        UploadedScores.load(ModelSpec(kind="scores", path=str(write(tmp_path, GOOD)), options={"scale": 2}))


@pytest.mark.parametrize("chunk_size", [1, 2, 3, 4096])
def test_the_content_hash_ignores_the_bom_and_line_ends_at_any_chunk_size(tmp_path, chunk_size):
    import hashlib

    from prblib.rows import content_sha256

    path = tmp_path / "s.jsonl"
    path.write_bytes(b"\xef\xbb\xbfa\r\nb\rc\r")
    assert content_sha256(path, chunk_size=chunk_size) == hashlib.sha256(b"a\nb\nc\n").hexdigest()
