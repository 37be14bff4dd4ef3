"""Non-finite model output (issue 10, case 3): a NaN or infinite score from any RM kind fails the
run with a reason naming how many pairs and the first id; nothing non-finite is stored or ranked."""

import json
import math

import pytest
from django.conf import settings
from django.core.management import CommandError, call_command

from leaderboard import services
from leaderboard.models import PairScore, RunStatus
from leaderboard.selectors import leaderboard_rows
from prblib.rewards.base import PairResult
from prblib.errors import ModelError
from pipeline.services import benchmark_import, rm_score_items
from prblib.tiny_models import build_decoder_rm, poison_score_head
from tests.pipeline.test_formats import SAMPLE

pytestmark = pytest.mark.django_db

# The worker and evaluate_rm score in chunks of about a twentieth of the run (8 of the sample's
# 30 pairs, pipeline.services.progress_chunk_size): the first chunk, the one that stops it, holds 8.
NAN_REASON = ("the model gave non-finite scores (NaN or infinity) for 8 of 8 pair(s) in this chunk, "
              "first 'synth-arts-001'; nothing of them was stored")


@pytest.fixture
def sample():
    return benchmark_import(path=SAMPLE, name="sample").benchmark


@pytest.fixture(scope="module")
def nan_rm(tmp_path_factory):
    return poison_score_head(build_decoder_rm(tmp_path_factory.mktemp("models") / "nan-rm"))


def test_evaluate_rm_exits_non_zero_with_one_line_naming_the_count_and_the_first_pair(sample, nan_rm, tmp_path):
    out = tmp_path / "pairs.jsonl"
    with pytest.raises(CommandError) as error:
        call_command("evaluate_rm", "--benchmark", "sample", "--model", str(nan_rm), "--kind", "scalar",
                     "--setting", "no_profile", "--out", str(out), "-v", "0")
    assert str(error.value) == NAN_REASON
    assert out.read_text() == ""  # no bare NaN token was written


def test_a_worker_run_of_a_nan_model_fails_with_that_reason_and_stays_off_the_leaderboard(researcher, sample, nan_rm):
    target = settings.MODELS_ROOT / "nan-rm"
    target.mkdir(parents=True, exist_ok=True)
    for file in nan_rm.iterdir():
        (target / file.name).write_bytes(file.read_bytes())
    submission = services.submission_create(user=researcher, request=services.SubmissionRequest(
        display_name="nan", benchmark="sample", kind="scalar", settings=("no_profile",), model_path="nan-rm",
        max_length=2048))
    run = submission.runs.get()
    assert services.run_execute(run_id=run.pk) == RunStatus.FAILED
    run.refresh_from_db()
    assert run.error == NAN_REASON
    assert PairScore.objects.filter(run=run).count() == 0
    assert leaderboard_rows() == []


class _FixedScores:
    """Any RM kind, reduced to what it returns: these scores for every pair."""

    kind = "pgenrm"

    def __init__(self, chosen, rejected):
        self.chosen, self.rejected = chosen, rejected

    def score_pairs(self, pairs, *, setting):
        return [PairResult(p.id, self.chosen, self.rejected) for p in pairs]


@pytest.mark.parametrize("chosen, rejected", [(math.nan, 1.0), (1.0, math.inf), (-math.inf, 0.0)])
def test_every_kind_is_checked_in_the_one_scoring_loop(sample, chosen, rejected):
    stored = []
    with pytest.raises(ModelError, match=r"for 4 of 4 pair\(s\) in this chunk, first 'synth-arts-001'"):
        rm_score_items(model=_FixedScores(chosen, rejected), items=sample.items.order_by("position")[:4],
                       setting="no_profile", on_chunk=stored.extend)
    assert stored == []


def test_a_judge_parse_failure_is_not_non_finite(sample):
    stored = []
    assert rm_score_items(model=_FixedScores(None, 1.0), items=sample.items.order_by("position")[:2],
                          setting="no_profile", on_chunk=stored.extend)
    assert len(stored) == 2


def test_json_written_by_the_api_is_strict(client):
    from rest_framework.renderers import JSONRenderer

    with pytest.raises(ValueError, match="Out of range float values are not JSON compliant"):
        JSONRenderer().render({"accuracy": math.nan})
    assert json.loads(JSONRenderer().render({"accuracy": 0.5})) == {"accuracy": 0.5}
