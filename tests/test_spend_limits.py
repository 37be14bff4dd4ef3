"""Spend under the operator's control (issue 29, fault 12): researchers pick a model among those
staff allow at an endpoint (its key is the staff's), and option bounds no submission passes."""

import json

import pytest
from django.core.management import CommandError, call_command

from leaderboard import services
from prblib.rewards.options import OptionsError, parse_options
from pipeline.models import LLMEndpoint
from tests.leaderboard.test_submissions import sample  # noqa: F401 (a fixture)

pytestmark = pytest.mark.django_db


def judge_request(model: str, **kwargs):
    return services.SubmissionRequest(display_name=f"judge {model}", benchmark="sample", kind="pairwise",
                                      settings=("profile",), judge_backend="hosted", model_path=model, **kwargs)


def test_a_researcher_picks_among_the_models_staff_allow(researcher, sample, capsys):  # noqa: F811
    call_command("llm_endpoint", "add", "hosted", "--base-url", "https://api.example.com/v1", "--api-key-env",
                 "HOSTED_KEY", "--model", "gpt-small", "--model", "gpt-mini")
    capsys.readouterr()
    call_command("llm_endpoint", "list", "--format", "json")
    assert json.loads(capsys.readouterr().out)[0]["allowed_models"] == ["gpt-small", "gpt-mini"]
    with pytest.raises(services.SubmissionRefused) as caught:
        services.submission_create(user=researcher, request=judge_request("gpt-5-pro"))
    assert str(caught.value) == ("Model 'gpt-5-pro' is not offered at judge backend 'hosted' (offered: gpt-small, "
                                 "gpt-mini).")
    assert caught.value.field == "model_path" and caught.value.status == 400
    submission = services.submission_create(user=researcher, request=judge_request("gpt-mini"))
    assert submission.model_path == "gpt-mini"


def test_an_endpoint_without_a_list_takes_any_model(researcher, sample):  # noqa: F811
    LLMEndpoint.objects.create(name="hosted", base_url="http://127.0.0.1:9/v1")
    assert services.submission_create(user=researcher, request=judge_request("my-own-vllm-model")).pk


def test_a_bad_allowed_model_name_is_one_line():
    with pytest.raises(CommandError, match=r"^--model 'two words' must be a model name of 1 to 300 characters "
                                           r"without spaces$"):
        call_command("llm_endpoint", "add", "hosted", "--base-url", "http://x/v1", "--model", "two words")


@pytest.mark.parametrize("options,message,key", [
    ({"m": 64}, "option 'm': Input should be less than or equal to 32", "m"),
    ({"max_tokens": 1_000_000}, "option 'max_tokens': Input should be less than or equal to 32768", "max_tokens"),
])
def test_pgenrm_options_past_the_bounds_are_refused(options, message, key):
    with pytest.raises(OptionsError) as caught:
        parse_options("pgenrm", options)
    assert (str(caught.value), caught.value.key) == (message, key)
    assert parse_options("pgenrm", {"m": 32, "max_tokens": 32768}).m == 32


def test_a_pgenrm_submission_past_the_bounds_is_a_400_naming_the_option(researcher, sample):  # noqa: F811
    LLMEndpoint.objects.create(name="hosted", base_url="http://127.0.0.1:9/v1")
    request = services.SubmissionRequest(display_name="P-GenRM", benchmark="sample", kind="pgenrm",
                                         settings=("profile",), judge_backend="hosted", model_path="chains",
                                         options={"m": 64, "max_tokens": 1_000_000})
    with pytest.raises(services.SubmissionRefused) as caught:
        services.submission_create(user=researcher, request=request)
    assert (str(caught.value), caught.value.field) == ("option 'm': Input should be less than or equal to 32", "m")


# --- spend caps per run and per researcher per day ----------------------------------------------

def _judge(researcher, name, **options):
    return services.submission_create(user=researcher, request=services.SubmissionRequest(
        display_name=name, benchmark="sample", kind="pairwise", settings=("no_profile",), judge_backend="judge",
        model_path=name.replace(" ", "-"), options=options))


def test_a_run_over_a_per_run_cap_is_refused_before_it_starts(researcher, sample, fake_openai):  # noqa: F811
    fake_openai.responder = lambda body: "Verdict: A"
    LLMEndpoint.objects.create(name="judge", base_url=fake_openai.base_url, max_retries=0, max_requests_per_run=50)
    with pytest.raises(services.SubmissionRefused) as caught:
        _judge(researcher, "both orders")  # 30 pairs x 2 orders = 60 requests
    assert (str(caught.value), caught.value.field) == (
        "Not queued: this run would need about 60 requests at judge backend 'judge', over its cap of 50 requests "
        "per run (max_requests_per_run) (30 pairs x 2 requests, each with its max_tokens); lower the options or ask "
        "staff.", "options")
    assert _judge(researcher, "one order", both_orders=False).pk  # 30 requests: within the cap
    assert fake_openai.requests == []  # nothing was sent for either


def test_a_run_reaching_the_daily_cap_stops_mid_way_with_the_reason_and_keeps_its_pairs(
        settings, researcher, sample, fake_openai):  # noqa: F811
    from leaderboard.models import PairScore
    from pipeline.models import EndpointSpend

    settings.RUN_CHUNK_PAIRS = 5  # 5 pairs (10 requests) between two checks
    fake_openai.responder = lambda body: "Verdict: A"  # 10 prompt and 2 completion tokens per answer
    endpoint = LLMEndpoint.objects.create(name="judge", base_url=fake_openai.base_url, max_retries=0)
    first, second = _judge(researcher, "first"), _judge(researcher, "second")  # 60 each: each fits the day alone
    endpoint.max_requests_per_day = 70  # set once both are queued (a queued run reserves its estimate)
    endpoint.save()
    assert services.run_execute(run_id=first.runs.get().pk) == "SUCCEEDED"
    assert EndpointSpend.objects.get(owner=researcher).requests == 60

    run = second.runs.get()
    assert services.run_execute(run_id=run.pk) == "FAILED"
    run.refresh_from_db()
    assert run.error == (
        "Stopped at a spend cap: your runs at judge backend 'judge' reached 70 requests today (UTC), its cap of 70 "
        "requests per researcher per day (max_requests_per_day). The 5 pairs scored so far are kept; a retry goes on "
        "from there once the cap allows (staff set the caps on the judge backend).")
    assert PairScore.objects.filter(run=run).count() == 5 and len(fake_openai.requests) == 70
    assert run.metrics["usage"]["requests"] == 10

    # Retried at once: refused before any request is sent.
    from jobs.services import job_retry

    job_retry(user=researcher, job=run)
    assert services.run_execute(run_id=run.pk) == "FAILED" and len(fake_openai.requests) == 70
    # Staff raise the cap: the retry scores only the 25 missing pairs (50 requests).
    endpoint.max_requests_per_day = 200
    endpoint.save()
    job_retry(user=researcher, job=run)
    assert services.run_execute(run_id=run.pk) == "SUCCEEDED"
    assert PairScore.objects.filter(run=run).count() == 30 and len(fake_openai.requests) == 120
    assert EndpointSpend.objects.get(owner=researcher).requests == 120


def test_spend_caps_are_set_with_llm_endpoint_add(capsys):
    call_command("llm_endpoint", "add", "hosted", "--base-url", "https://api.example.com/v1",
                 "--max-requests-per-run", "500", "--max-cost-per-day", "2.5")
    capsys.readouterr()
    call_command("llm_endpoint", "list", "--format", "json")
    row = json.loads(capsys.readouterr().out)[0]
    assert {k: v for k, v in row.items() if k.startswith("max_") and k != "max_retries" and k != "max_concurrency"} == {
        "max_requests_per_run": 500, "max_tokens_per_run": None, "max_cost_per_run": None,
        "max_requests_per_day": None, "max_tokens_per_day": None, "max_cost_per_day": "2.5000"}
    with pytest.raises(CommandError, match=r"^--max-tokens-per-run must be a whole number from 0 to 99999999, "
                                           r"not -1$"):
        call_command("llm_endpoint", "add", "other", "--base-url", "http://x/v1", "--max-tokens-per-run", "-1")


# --- a cancelled run frees its worker -------------------------------------------------------------

@pytest.mark.django_db(transaction=True)
def test_cancelling_a_run_stuck_on_a_hung_endpoint_frees_the_worker_within_a_beat(settings, researcher,
                                                                                  fake_openai):
    import threading
    import time

    from jobs.services import job_cancel
    from pipeline.services import benchmark_import
    from tests.prblib.fake_openai import hang
    from tests.pipeline.test_formats import SAMPLE

    settings.RUN_HEARTBEAT_SECONDS = 0.2
    benchmark_import(path=SAMPLE, name="sample")
    fake_openai.script(*[hang(120) for _ in range(8)])  # every request hangs (until the server stops)
    LLMEndpoint.objects.create(name="judge", base_url=fake_openai.base_url, max_retries=0, timeout_seconds=60,
                               deadline_seconds=600, max_concurrency=2)
    run = _judge(researcher, "stuck").runs.get()
    outcome = {}
    worker = threading.Thread(target=lambda: outcome.setdefault("status", services.run_execute(run_id=run.pk)))
    worker.start()
    deadline = time.monotonic() + 120
    while fake_openai.in_flight < 2 and time.monotonic() < deadline:  # both requests of the first wave hang
        time.sleep(0.05)
    assert fake_openai.in_flight == 2
    cancelled_at = time.monotonic()
    assert job_cancel(user=researcher, job=run)
    worker.join(timeout=30)
    freed_after = time.monotonic() - cancelled_at
    try:
        assert not worker.is_alive()  # before: the hung wave held it for the request timeout (60 s) and more
        assert freed_after < 15, freed_after  # a beat (0.2 s), the loop's 1 s check, and a loaded machine
        run.refresh_from_db()
        assert outcome["status"] == "CANCELLED" and run.status == "CANCELLED"
        assert len(fake_openai.requests) == 2  # nothing sent after the cancel
    finally:
        fake_openai.stop()  # wakes the hanging handlers
        worker.join(timeout=30)
