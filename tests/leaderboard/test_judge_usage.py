"""Generative judges record their token cost like P-GenRM (issue 13): a pairwise or pointwise
judge run against an OpenAI-compatible endpoint stores the endpoint's requests, tokens and cost,
and its judgments, in the run's metrics (shown as the judge's cost on the submission page)."""

import pytest

from leaderboard import services
from pipeline.models import LLMEndpoint
from pipeline.services import benchmark_import
from tests.pipeline.test_formats import SAMPLE

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("kind, verdict", [("pairwise", "Verdict: A"), ("pointwise", "Score: 7")])
def test_a_judge_run_stores_its_token_usage_in_the_run_metrics(kind, verdict, researcher, fake_openai):
    benchmark_import(path=SAMPLE, name="sample")  # 30 pairs
    fake_openai.responder = lambda body: verdict  # 10 prompt tokens, 2 completion tokens (words) per answer
    LLMEndpoint.objects.create(name="judge", base_url=fake_openai.base_url, max_retries=0,
                               price_prompt_per_1k=1, price_completion_per_1k=2)
    submission = services.submission_create(user=researcher, request=services.SubmissionRequest(
        display_name=f"{kind} judge", benchmark="sample", kind=kind, settings=("no_profile",), judge_backend="judge",
        model_path="judge-model"))
    run = submission.runs.get()
    assert services.run_execute(run_id=run.pk) == "SUCCEEDED", run.error
    run.refresh_from_db()
    # 30 pairs, two judgments each (pairwise: both orders; pointwise: chosen and rejected rated alone).
    assert len(fake_openai.requests) == 60
    assert run.metrics["usage"] == {
        "requests": 60, "prompt_tokens": 600, "completion_tokens": 120, "cost": pytest.approx(0.84),
        "cache_hits": 0, "cache_misses": 60, "requests_without_usage": 0,  # every answer carried its usage
        "judgments": 60, "judgment_prompt_tokens": 600, "judgment_completion_tokens": 120}
