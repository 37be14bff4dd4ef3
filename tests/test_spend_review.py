"""Spend caps after the hostile review (faults F2-F4): a reply without `usage` is charged at the
per-request estimate, never as 0; P-GenRM's estimate counts its neighbours' chains; a run that
spends exactly its cap succeeds."""

import math
from decimal import Decimal

import pytest

from leaderboard import services
from leaderboard.models import PairScore
from pipeline.endpoints import requests_per_pair, spend_of_usage
from pipeline.models import BenchmarkItem, EndpointSpend, LLMEndpoint
from tests.leaderboard.test_submissions import sample  # noqa: F401 (a fixture)
from tests.prblib.fake_openai import choice, completion, raw
from tests.test_spend_limits import _judge

pytestmark = pytest.mark.django_db


def test_a_reply_without_usage_is_charged_its_estimate_not_zero():
    charge = {"tokens": 600.0, "cost": 0.6, "price_prompt_per_1k": 1.0, "price_completion_per_1k": 2.0}
    usage = {"requests": 3, "requests_without_usage": 1, "prompt_tokens": 20, "completion_tokens": 4, "cost": None}
    # 20 + 4 reported tokens plus 600 charged; 20 x 1/1000 + 4 x 2/1000 + 0.6 = 0.628
    assert spend_of_usage(usage, charge) == pytest.approx({"requests": 3, "tokens": 624, "cost": 0.628})
    known = {"requests": 2, "requests_without_usage": 0, "prompt_tokens": 20, "completion_tokens": 4, "cost": 0.028}
    assert spend_of_usage(known, charge) == pytest.approx({"requests": 2, "tokens": 24, "cost": 0.028})


def test_a_run_with_a_usage_less_reply_stops_at_its_cost_cap(settings, researcher, sample, fake_openai):  # noqa: F811
    settings.RUN_CHUNK_PAIRS = 5  # 10 requests between two checks
    endpoint = LLMEndpoint.objects.create(name="judge", base_url=fake_openai.base_url, max_retries=0,
                                          max_concurrency=1, price_prompt_per_1k=1, price_completion_per_1k=1)
    run = _judge(researcher, "no usage").runs.get()
    endpoint.max_cost_per_run = Decimal("0.5")  # staff lower the cap after the run was queued
    endpoint.save()
    fake_openai.script(raw(completion(choice("Verdict: A"), usage=None)))  # the first reply has no usage
    fake_openai.responder = lambda body: "Verdict: A"  # then 10 prompt and 2 completion tokens each

    # The charge of the usage-less reply: the run's prompt estimate (question and both answers, 4
    # characters a token, for each of the 60 requests) per request, rounded up, plus max_tokens 512.
    characters = sum(len(q) + len(c) + len(r) for q, c, r in BenchmarkItem.objects.filter(
        benchmark__name="sample").values_list("question", "chosen", "rejected"))
    charged = math.ceil(characters // 4 * 2 / 60) + 512
    tokens = 9 * (10 + 2) + charged  # the first chunk: 9 replies with usage and the one without
    cost = tokens / 1000  # both prices 1 per 1,000 tokens

    assert services.run_execute(run_id=run.pk) == "FAILED"  # before: SUCCEEDED, its cost counted as 0
    run.refresh_from_db()
    assert cost > 0.5
    assert run.error == (
        f"Stopped at a spend cap: this run reached {cost:,.4f} in cost at judge backend 'judge', over its cap of "
        "0.5000 in cost per run (max_cost_per_run). The 5 pairs scored so far are kept; a retry goes on from there "
        "once the cap allows (staff set the caps on the judge backend).")
    assert len(fake_openai.requests) == 10 and PairScore.objects.filter(run=run).count() == 5
    spend = EndpointSpend.objects.get(owner=researcher)
    assert (spend.requests, spend.tokens) == (10, tokens) and float(spend.cost) == pytest.approx(cost, abs=1e-4)
    usage = run.metrics["usage"]  # what the researcher sees: the unknown stays unknown
    assert (usage["requests_without_usage"], usage["cost"], usage["prompt_tokens"]) == (1, None, 90)


@pytest.mark.parametrize("options,expected", [
    ({"m": 4, "n": 3}, 7),  # 4 chains for the user and one for each of 3 neighbours
    ({"m": 4, "n": 0}, 4),
    ({"preset": "paper"}, 24),  # m 16, n 8
])
def test_pgenrm_requests_per_pair_counts_the_neighbours_chains(options, expected):
    assert requests_per_pair("pgenrm", options) == expected


def test_a_run_that_spends_exactly_its_cap_succeeds(settings, researcher, sample, fake_openai):  # noqa: F811
    settings.RUN_CHUNK_PAIRS = 5
    fake_openai.responder = lambda body: "Verdict: A"
    LLMEndpoint.objects.create(name="judge", base_url=fake_openai.base_url, max_retries=0,
                               max_requests_per_run=60, max_requests_per_day=60)
    run = _judge(researcher, "exact").runs.get()  # 30 pairs x 2 orders = 60: queued, not over the caps
    assert services.run_execute(run_id=run.pk) == "SUCCEEDED"  # before: FAILED after its last pair
    run.refresh_from_db()
    assert (run.error, PairScore.objects.filter(run=run).count(), len(fake_openai.requests)) == ("", 30, 60)
    assert EndpointSpend.objects.get(owner=researcher).requests == 60
    with pytest.raises(services.SubmissionRefused, match=r"would reach 120 requests today \(UTC\), over its cap of "
                                                         r"60 requests per researcher per day"):
        _judge(researcher, "another")


def test_a_run_that_passes_its_cap_with_its_last_chunk_stops(settings, researcher, sample, fake_openai):  # noqa: F811
    settings.RUN_CHUNK_PAIRS = 5
    fake_openai.responder = lambda body: "Verdict: A"
    endpoint = LLMEndpoint.objects.create(name="judge", base_url=fake_openai.base_url, max_retries=0)
    run = _judge(researcher, "over").runs.get()
    endpoint.max_requests_per_run = 55  # lowered after queueing: 50 after 5 chunks, 60 after the 6th and last
    endpoint.save()
    assert services.run_execute(run_id=run.pk) == "FAILED"
    run.refresh_from_db()
    assert run.error.startswith("Stopped at a spend cap: this run reached 60 requests at judge backend 'judge', "
                                "over its cap of 55 requests per run (max_requests_per_run). The 30 pairs")


def test_queued_runs_reserve_their_estimate_under_the_daily_cap(researcher, sample, fake_openai):  # noqa: F811
    LLMEndpoint.objects.create(name="judge", base_url=fake_openai.base_url, max_requests_per_day=100)
    first = _judge(researcher, "first")  # 60 requests, queued: 60 of the day's 100 reserved
    with pytest.raises(services.SubmissionRefused) as caught:
        _judge(researcher, "second")  # before: queued too (each checked against the empty ledger alone)
    assert str(caught.value) == (
        "Not queued: your runs at judge backend 'judge' would reach 120 requests today (UTC) with what your queued "
        "and running runs there would still spend, over its cap of 100 requests per researcher per day "
        "(max_requests_per_day) (30 pairs x 2 requests, each with its max_tokens); lower the options or ask staff.")
    assert _judge(researcher, "one order", both_orders=False).pk  # 60 + 30 = 90: fits
    run = first.runs.get()  # with 20 of its pairs scored, the first run reserves only its 10 pairs left (20)
    PairScore.objects.bulk_create([PairScore(run=run, item=item, chosen_score=1.0, rejected_score=0.0, correct=True,
                                             tie=False, details={}) for item in run.submission.benchmark.items
                                   .order_by("position")[:20]])
    assert _judge(researcher, "third", both_orders=False).pk  # 20 + 30 + 30 = 80
    assert fake_openai.requests == []
