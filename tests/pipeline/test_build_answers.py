"""A build against an endpoint that behaves like real ones: truncated, refused and fenced answers,
server-directed waits in every Retry-After form, and a soft time limit with requests hanging."""

import json
import re
import signal
import time

import pytest
from celery.exceptions import SoftTimeLimitExceeded
from django.test import override_settings

from pipeline.build import build_create, build_execute, build_resume
from pipeline.models import BuildRun, BuildStatus, LLMEndpoint
from tests.prblib.fake_openai import Reply, fenced, hang, rate_limited, text, truncated
from tests.pipeline.test_build import answer, lamp_folder  # noqa: F401 (a fixture)

pytestmark = pytest.mark.django_db

REFUSAL = "I'm sorry, but I can't help with that request."
CUT = "Paint small studies outdoors and then the answer stops in the middle of a"


def item_and_side(body: dict) -> tuple[int, str]:
    user = body["messages"][-1]["content"]
    number = int(re.search(r"landscapes\? \((\d+)\)", user).group(1))
    if "ASPECT-" not in user:
        return number, "planner"
    return number, "chosen" if "for this person in particular" in user else "rejected"


class MisbehavingEndpoint:
    """Per item (the LaMP-QA rows lamp-0, 1, 10, 11, 20, 21):
    lamp-0   the chosen answer is always cut at the token cap          -> failed, truncated
    lamp-1   the rejected answer is always a refusal                    -> failed, refused
    lamp-10  chosen cut once (then whole); the plan comes in a ```json fence  -> kept
    lamp-11  the plan is JSON of the wrong shape                        -> failed, unparseable
    lamp-20  each first request is a 429: Retry-After 1 s (chosen), retry-after-ms 300 (rejected),
             an HTTP-date 2 s ahead (plan)                              -> kept after the waits
    lamp-21  the chosen request is a 429 asking for 600 s, over the cap -> failed, rate_limited
    Every reply is logged with its status, to check that nothing was paid for twice."""

    def __init__(self):
        self.seen: dict[tuple[int, str], int] = {}
        self.log: list[tuple[str, int]] = []

    def __call__(self, body: dict) -> Reply:
        number, side = item_and_side(body)
        nth = self.seen[(number, side)] = self.seen.get((number, side), 0) + 1
        reply = self.reply(number, side, nth, body)
        reply = text(reply) if isinstance(reply, str) else reply
        self.log.append((json.dumps(body, sort_keys=True), reply.status))
        return reply

    def reply(self, number: int, side: str, nth: int, body: dict):
        if side == "planner":
            if number == 10:
                return fenced('["Practises quietly at night", "Budget under $50", "Weekend-sized sessions"]')
            if number == 11:
                return fenced('{"needs": "quiet"}')
            if number == 20 and nth == 1:
                return rate_limited(date=2)
            return "- Practical, low-cost steps\n- Builds on the watercolour lessons"
        if number == 0 and side == "chosen":
            return truncated(CUT)
        if number == 1 and side == "rejected":
            return REFUSAL
        if number == 10 and side == "chosen" and nth == 1:
            return truncated(CUT)
        if number == 20 and nth == 1:
            return rate_limited(seconds=1) if side == "chosen" else rate_limited(ms=300)
        if number == 21 and side == "chosen":
            return rate_limited(seconds=600)
        return answer(body)


def new_build(staff_user, **kwargs):
    return build_create(user=staff_user, name="wild-v1", source_path="lamp-qa", split="test", generator="fake",
                        generator_model="gen-model", planner="fake", planner_model="plan-model", temperature=0.0,
                        **kwargs)


@override_settings(LLM_MAX_RETRY_WAIT=120)
def test_a_build_against_a_misbehaving_endpoint_keeps_none_of_the_bad_answers(staff_user, lamp_folder,  # noqa: F811
                                                                              fake_openai, client):
    endpoint = MisbehavingEndpoint()
    fake_openai.responder = endpoint
    LLMEndpoint.objects.create(name="fake", base_url=fake_openai.base_url, max_retries=1)
    build = new_build(staff_user)

    assert build_execute(build_id=build.pk) == BuildStatus.FAILED
    build.refresh_from_db()
    assert build.counts["failed"] == 4
    assert build.counts["failed_by_reason"] == {"truncated": 1, "refused": 1, "unparseable": 1, "rate_limited": 1}
    reasons = dict(build.items.exclude(error="").values_list("source_id", "error_reason"))
    assert reasons == {"lamp-0": "truncated", "lamp-1": "refused", "lamp-11": "unparseable",
                       "lamp-21": "rate_limited"}
    stages = dict(build.items.exclude(error="").values_list("source_id", "error_stage"))
    assert stages == {"lamp-0": "generate", "lamp-1": "generate", "lamp-11": "plan", "lamp-21": "generate"}
    assert "more than max_retry_wait (120 s)" in build.items.get(source_id="lamp-21").error
    generator, planner = build.tokens["generator"], build.tokens["planner"]
    assert generator["events"] == {"truncated_retried": 2, "truncated": 1, "refused_retried": 1, "refused": 1}
    assert (generator["server_waits"], planner["server_waits"]) == (2, 1)
    assert generator["waited_seconds"] == pytest.approx(1.3, abs=0.01)
    # An HTTP-date 2 s ahead at one-second resolution is 1-2 s away when the server writes it, and
    # the client reads it a few ms later (make test once measured 0.999 s).
    assert 0.9 <= planner["waited_seconds"] <= 2
    assert build.progress_text == ""  # cleared when the build stopped

    client.force_login(staff_user)
    html = client.get(build.get_absolute_url()).content.decode()
    for reason in ("truncated 1", "refused 1", "unparseable 1", "rate_limited 1"):
        assert reason in html
    assert "truncated_retried 2" in html and "directed by the endpoint" in html

    # Finish without the failed items: nothing is asked again.
    sent = len(fake_openai.requests)
    build_resume(build=BuildRun.objects.get(pk=build.pk), skip_failed=True, enqueue=False)
    assert build_execute(build_id=build.pk) == BuildStatus.SUCCEEDED
    assert len(fake_openai.requests) == sent
    build.refresh_from_db()
    benchmark = build.benchmark
    assert sorted(benchmark.items.values_list("source_id", flat=True)) == ["lamp-10", "lamp-20"]
    assert benchmark.metadata["failed_by_reason"] == build.counts["failed_by_reason"]
    for item in benchmark.items.all():
        assert CUT not in item.chosen + item.rejected and REFUSAL not in item.chosen + item.rejected
        assert item.chosen.startswith("Paint small studies outdoors and compare them.")
        assert not any("json" in aspect or "```" in aspect or "[" in aspect for aspect in item.plan)
    assert benchmark.items.get(source_id="lamp-10").plan == ["Practises quietly at night", "Budget under $50",
                                                             "Weekend-sized sessions"]

    # No request was paid for twice: every answered (200) request is different; the repeats are
    # the 429s, which are not answered and not billed.
    paid = [body for body, status in endpoint.log if status == 200]
    unpaid = [body for body, status in endpoint.log if status != 200]
    assert len(paid) == len(set(paid)) == 15 and len(unpaid) == 4
    assert generator["requests"] + planner["requests"] == 19


def test_the_soft_time_limit_stops_a_build_within_seconds_keeping_what_is_done(staff_user, lamp_folder,  # noqa: F811
                                                                               fake_openai):
    def respond(body):
        number, _ = item_and_side(body)
        return answer(body) if number in (0, 1) else hang(60)

    fake_openai.responder = respond
    LLMEndpoint.objects.create(name="fake", base_url=fake_openai.base_url, max_retries=4, timeout_seconds=30,
                               max_concurrency=2)
    build = new_build(staff_user)
    stopped_at = {}

    def time_limit(signum, frame):
        stopped_at["t"] = time.monotonic()
        raise SoftTimeLimitExceeded()

    def progress(stage, n):  # arm the "soft limit" once generation has finished its first item
        if stage == "generated" and not stopped_at:
            stopped_at["armed"] = True
            signal.setitimer(signal.ITIMER_REAL, 1.0)

    previous = signal.signal(signal.SIGALRM, time_limit)
    try:
        status = build_execute(build_id=build.pk, progress=progress)
        returned = time.monotonic()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert status == BuildStatus.FAILED and "t" in stopped_at
    assert returned - stopped_at["t"] < 5  # not the 30 s timeout times 5 attempts
    build.refresh_from_db()
    done = build.items.exclude(chosen="").count()
    assert done >= 1 and build.error.startswith("Stopped by the time limit")
    assert f"the {done} item(s) generated so far are kept" in build.error
    assert set(build.items.exclude(chosen="").values_list("source_id", flat=True)) <= {"lamp-0", "lamp-1"}


def test_repeated_profile_posts_are_ranked_once_and_counted(staff_user, fake_openai, settings):
    from tests.pipeline.test_build import lamp_row

    folder = settings.DATA_ROOT / "dupes"
    folder.mkdir(parents=True)
    row = lamp_row(7, "Art_and_Entertainment")
    watercolour = row["profile"][3]
    # The same post twice under its id, and its text again under another id (with other spacing).
    row["profile"] += [dict(watercolour), {"id": "copy", "text": "  " + watercolour["text"].replace(" ", "  ") + " ",
                                           "category": "x"}]
    (folder / "test.jsonl").write_text(json.dumps(row) + "\n")
    fake_openai.responder = answer
    LLMEndpoint.objects.create(name="fake", base_url=fake_openai.base_url, max_retries=1)
    build = build_create(user=staff_user, name="dupes-v1", source_path="dupes", generator="fake",
                         generator_model="gen-model", temperature=0.0, profile_k=10)
    assert build_execute(build_id=build.pk) == BuildStatus.SUCCEEDED
    build.refresh_from_db()
    item = build.items.get()
    assert len(item.profile) == 8 and len(item.ranked_profile) == 6  # 8 posts, 2 repeats, k = 10
    assert len({p["id"] for p in item.ranked_profile}) == 6
    assert len({" ".join(p["text"].split()) for p in item.ranked_profile}) == 6
    assert item.outputs["duplicate_posts_removed"] == 2 and build.counts["duplicate_posts_removed"] == 2
    assert build.benchmark.metadata["duplicate_posts_removed"] == 2


def planner_answers(plan_reply):
    def respond(body):
        _, side = item_and_side(body)
        return plan_reply if side == "planner" else answer(body)
    return respond


def test_the_planner_asks_an_endpoint_that_takes_it_for_json_of_the_plans_shape(staff_user, lamp_folder,  # noqa: F811
                                                                                  fake_openai):
    fake_openai.responder = planner_answers(json.dumps({"aspects": ["Practises quietly at night", "Budget under $50"]}))
    endpoint = LLMEndpoint.objects.create(name="fake", base_url=fake_openai.base_url, max_retries=0)
    build = new_build(staff_user)
    assert build_execute(build_id=build.pk) == BuildStatus.SUCCEEDED
    bodies = [r["body"] for r in fake_openai.requests]
    planner = [b for b in bodies if item_and_side(b)[1] == "planner"]
    assert len(planner) == 6 and not any("response_format" in b for b in bodies if b not in planner)
    for body in planner:
        assert body["response_format"]["type"] == "json_schema"
        schema = body["response_format"]["json_schema"]["schema"]
        assert schema["properties"]["aspects"] == {"items": {"type": "string"}, "title": "Aspects", "type": "array"}
        assert schema["required"] == ["aspects"]
    build.refresh_from_db()
    assert {tuple(i.plan) for i in build.benchmark.items.all()} == {("Practises quietly at night", "Budget under $50")}
    endpoint.refresh_from_db()
    assert endpoint.response_format == "json_schema"


def test_a_server_refusing_response_format_is_asked_once_more_without_it_and_remembered(staff_user, lamp_folder,  # noqa: F811
                                                                                        fake_openai):
    fake_openai.responder = planner_answers("- Practical, low-cost steps\n- Builds on the watercolour lessons")
    fake_openai.reject_response_format = True
    endpoint = LLMEndpoint.objects.create(name="fake", base_url=fake_openai.base_url, max_retries=0,
                                          max_concurrency=1)
    build = new_build(staff_user)
    assert build_execute(build_id=build.pk) == BuildStatus.SUCCEEDED, build.error
    bodies = [json.dumps(r["body"], sort_keys=True) for r in fake_openai.requests]
    refused = [b for b in bodies if "response_format" in b]
    assert len(refused) == 1  # the first plan request; every later one goes without it
    answered = [b for b in bodies if "response_format" not in b]
    assert len(answered) == len(set(answered)) == 6 * 3  # chosen, rejected, plan: each paid for once
    build.refresh_from_db()
    assert build.tokens["planner"]["events"] == {"response_format_refused": 1}
    assert all(i.plan == ["Practical, low-cost steps", "Builds on the watercolour lessons"]
               for i in build.benchmark.items.all())
    endpoint.refresh_from_db()
    assert endpoint.response_format == "none"

    # Remembered for the endpoint: the next build never sends it.
    sent = len(fake_openai.requests)
    second = build_create(user=staff_user, name="wild-v2", source_path="lamp-qa", split="test", generator="fake",
                          generator_model="gen-model", planner="fake", planner_model="plan-model", temperature=0.0,
                          limit=2)
    assert build_execute(build_id=second.pk) == BuildStatus.SUCCEEDED
    assert not any("response_format" in r["body"] for r in fake_openai.requests[sent:])
