"""Building a benchmark from LaMP-QA: retrieval, generation through an OpenAI-compatible
endpoint (a fake server on loopback), planner, failures, resume without paying twice."""

import html
import json

import pytest
from django.conf import settings
from django.core.management import CommandError, call_command

from pipeline.build import BuildError, build_create, build_execute, build_resume
from pipeline.models import BuildRun, BuildStatus, LLMEndpoint
from tests.prblib.fake_openai import status

pytestmark = pytest.mark.django_db

NARRATIVE = "NARRATIVE-SENTINEL the user secretly wants a cheap plan"
SUBSETS = ("Art_and_Entertainment", "Lifestyle_and_Personal_Development", "Society_and_Culture")


def lamp_row(i: int, subset: str) -> dict:
    posts = [{"id": f"u{i}-p{j}", "text": text, "category": subset} for j, text in enumerate([
        "I repaint old furniture every weekend.", "My budget is tight this year.",
        "I love long hikes in the mountains.", f"I am learning watercolour, lesson {i}.",
        "Football on Sundays with friends.", "I read a lot of history books."])]
    return {"id": f"lamp-{i}", "question": f"How can I get better at painting landscapes? ({i})",
            "narrative": NARRATIVE, "category": subset, "profile": posts,
            "rubric_aspects": [{"aspect": f"ASPECT-{i} fits a tight budget", "evidence": "budget is tight",
                                "reason": "money"}]}


@pytest.fixture
def lamp_folder():
    root = settings.DATA_ROOT / "lamp-qa"
    for n, subset in enumerate(SUBSETS):
        (root / subset).mkdir(parents=True, exist_ok=True)
        rows = [lamp_row(n * 10 + k, subset) for k in range(2)]
        (root / subset / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (root / subset / "train.jsonl").write_text(json.dumps(lamp_row(n * 10 + 5, subset)) + "\n")
    return root


def reply(body: dict):
    """Answers of ~120 words; the planner gets bullet aspects; one question always fails."""
    text = json.dumps(body["messages"])
    if "(10)" in text:
        return status(500)
    if "ASPECT-" not in text:  # the planner never sees the rubric
        return "- Practical, low-cost steps\n- Builds on the watercolour lessons\n- Weekend-sized practice"
    return answer(body)


def answer(body: dict) -> str:
    # ~120 words that differ between the chosen and the avoid prompt, as a real generator's would.
    variant = sum(map(ord, json.dumps(body["messages"]))) % 997
    return " ".join(["Paint small studies outdoors and compare them."] * 17) + f" Variant {variant}."


@pytest.fixture
def endpoint(fake_openai):
    fake_openai.responder = reply
    return LLMEndpoint.objects.create(name="fake", base_url=fake_openai.base_url, max_retries=1)


def new_build(staff_user, **kwargs):
    params = dict(user=staff_user, name="built-v1", source_path="lamp-qa", split="test", generator="fake",
                  generator_model="gen-model", planner="fake", planner_model="plan-model", temperature=0.0)
    params.update(kwargs)
    return build_create(**params)


def test_a_build_retrieves_generates_plans_and_waits_for_a_failed_item(staff_user, lamp_folder, endpoint,
                                                                        fake_openai):
    build = new_build(staff_user)
    assert build_execute(build_id=build.pk) == BuildStatus.FAILED
    build.refresh_from_db()
    assert build.counts == {"total": 6, "retrieved": 6, "generated": 5, "planned": 5, "failed": 1,
                            "duplicate_posts_removed": 0, "failed_by_reason": {"error": 1}}
    failed = build.items.get(error__gt="")
    assert failed.source_id == "lamp-10" and failed.error_stage == "generate" and "500" in failed.error
    assert failed.error_reason == "error"
    assert "resume" in build.error and build.benchmark is None

    bodies = [json.dumps(r["body"]) for r in fake_openai.requests]
    assert all("NARRATIVE-SENTINEL" not in b for b in bodies)
    generation = [b for b in bodies if "ASPECT-" in b]
    planning = [b for b in bodies if "ASPECT-" not in b]
    assert generation and planning
    # Chosen and rejected prompts for the same item differ only by their instructions.
    item = build.items.get(source_id="lamp-0")
    own = [b for b in generation if "ASPECT-0 " in b]
    assert len(own) == 2 and own[0] != own[1]
    assert item.avoid_template is not None and item.avoid_template.purpose == "avoid"
    assert item.outputs["generation"]["length_ratio"] == pytest.approx(1.0)
    assert item.plan == ["Practical, low-cost steps", "Builds on the watercolour lessons", "Weekend-sized practice"]


def test_retrieval_keeps_the_top_k_posts_attached_to_their_texts(staff_user, lamp_folder, endpoint):
    from prblib.construction.retrieval import DenseRetriever

    build = new_build(staff_user, profile_k=3)
    build_execute(build_id=build.pk)
    item = build.items.get(source_id="lamp-1")
    expected = DenseRetriever.default().rank(item.question, item.profile, k=3)
    assert [p["id"] for p in item.ranked_profile] == [post["id"] for post, _ in expected]
    texts = {p["id"]: p["text"] for p in item.profile}
    assert all(texts[p["id"]] == p["text"] for p in item.ranked_profile)


def test_a_resume_retries_only_the_failed_item_and_pays_nothing_twice(staff_user, lamp_folder, endpoint,
                                                                      fake_openai):
    build = new_build(staff_user)
    build_execute(build_id=build.pk)
    sent = len(fake_openai.requests)
    fake_openai.responder = lambda body: reply(body) if "(10)" not in json.dumps(body) else answer(body)
    # As if a worker had died after paying for lamp-0's answers but before saving them.
    build.items.filter(source_id="lamp-0").update(chosen="", rejected="", plan=None)
    build_resume(build=BuildRun.objects.get(pk=build.pk), enqueue=False)
    assert build_execute(build_id=build.pk) == BuildStatus.SUCCEEDED
    new_requests = [json.dumps(r["body"]) for r in fake_openai.requests[sent:]]
    assert new_requests and all("(10)" in b for b in new_requests)  # only the item that had failed
    build.refresh_from_db()
    benchmark = build.benchmark
    assert benchmark.source == "built" and benchmark.item_count == 6
    assert benchmark.metadata["generator"] == "gen-model"
    stored = benchmark.items.get(source_id="lamp-0")
    assert stored.plan and stored.narrative == NARRATIVE and len(stored.profile) == 6
    assert "score" not in stored.profile[0]
    assert build.tokens["generator"]["cache_hits"] >= 2  # lamp-0's two answers came from the cache


def test_skipping_failed_items_finishes_with_the_rest(staff_user, lamp_folder, endpoint):
    build = new_build(staff_user, planner="", planner_model="")
    build_execute(build_id=build.pk)
    build_resume(build=BuildRun.objects.get(pk=build.pk), skip_failed=True, enqueue=False)
    assert build_execute(build_id=build.pk) == BuildStatus.SUCCEEDED
    build.refresh_from_db()
    assert build.benchmark.item_count == 5 and build.benchmark.metadata["failed_items"] == 1


def test_build_refusals_are_clear(staff_user, researcher, lamp_folder, endpoint, tmp_path):
    with pytest.raises(BuildError, match="Only staff"):
        new_build(researcher)
    with pytest.raises(BuildError, match="outside the data folder"):
        new_build(staff_user, source_path=str(tmp_path))
    with pytest.raises(BuildError, match="no enabled LLM endpoint"):
        new_build(staff_user, generator="missing")
    bad = settings.DATA_ROOT / "bad"
    bad.mkdir()
    (bad / "rows.jsonl").write_text(json.dumps({"id": "x", "question": "q", "profile": "nope"}) + "\n")
    build = new_build(staff_user, name="bad-build", source_path="bad", split="")
    assert build_execute(build_id=build.pk) == BuildStatus.FAILED
    build.refresh_from_db()
    assert "rows.jsonl, line 1, field 'profile'" in build.error and build.items.count() == 0


def test_the_command_runs_the_same_stages_and_can_resume(lamp_folder, endpoint, capsys):
    with pytest.raises(CommandError, match="failed"):
        call_command("build_benchmark", "--source", "lamp-qa", "--name", "cli-v1", "--split", "test",
                     "--generator", "fake", "--generator-model", "gen-model", "-v", "0")
    build = BuildRun.objects.get(name="cli-v1")
    call_command("build_benchmark", "--resume", str(build.pk), "--skip-failed", "-v", "0")
    assert "benchmark 'cli-v1' has 5 items" in capsys.readouterr().out


@pytest.mark.django_db(transaction=True)
def test_a_build_runs_as_a_celery_task_on_a_worker(staff_user, lamp_folder, endpoint, celery_worker_process):
    from pipeline.build import build_enqueue
    from tests.conftest import wait_for_job

    build = new_build(staff_user, name="worker-v1", domains=["arts_entertainment"], planner="", planner_model="")
    build_enqueue(build=build)
    wait_for_job(build, worker=celery_worker_process, what="the build to finish on the worker",
                 until=(BuildStatus.SUCCEEDED, BuildStatus.FAILED), timeout=180)
    build.refresh_from_db()
    assert build.status == BuildStatus.SUCCEEDED, build.error
    assert build.counts["generated"] == 2 and build.benchmark.item_count == 2


def test_editing_a_template_in_the_admin_writes_a_new_version(client, staff_user):
    from pipeline.build import templates_ensure_defaults
    from pipeline.models import PromptTemplate

    templates_ensure_defaults()
    original = PromptTemplate.objects.get(name="chosen", version=1)
    client.force_login(staff_user)
    url = f"/admin/pipeline/prompttemplate/{original.pk}/change/"
    bad = client.post(url, {"system": "s", "user": "Answer {{ question }} using {{ profile }} only."})
    assert bad.status_code == 200 and "missing the variables {{ aspects }}" in html.unescape(bad.content.decode())
    ok = client.post(url, {"system": "Be kind.", "user": original.user + "\\nBe brief."})
    assert ok.status_code == 302
    versions = list(PromptTemplate.objects.filter(name="chosen").order_by("version").values_list("version", "system"))
    assert versions == [(1, original.system), (2, "Be kind.")]


def test_adding_a_template_in_the_admin_starts_at_version_one(client, staff_user):
    from pipeline.models import PromptTemplate

    client.force_login(staff_user)
    response = client.post("/admin/pipeline/prompttemplate/add/", {
        "name": "avoid-terse", "purpose": "avoid", "system": "",
        "user": "Answer {{ question }} for someone with posts {{ profile }}, ignoring {{ aspects }}, "
                "in {{ target_words }} words."})
    assert response.status_code == 302, response.content.decode()[:500]
    assert list(PromptTemplate.objects.filter(name="avoid-terse").values_list("version", flat=True)) == [1]


def test_pairs_outside_the_length_band_fail_listed_with_their_ratio_then_regenerate_or_drop(
        staff_user, lamp_folder, endpoint, fake_openai, capsys):
    """The fault: pairs still outside 0.8-1.25 after regeneration stayed in the benchmark."""
    def lopsided(body):
        text = json.dumps(body["messages"])
        if "(1)" in text and "Do not" in text:  # lamp-1's rubric-blind answer is always short
            return " ".join(["Paint outdoors."] * 20)
        return reply(body) if "(10)" not in text else answer(body)

    fake_openai.responder = lopsided
    build = new_build(staff_user, planner="", planner_model="")
    assert build_execute(build_id=build.pk) == BuildStatus.FAILED
    item = build.items.get(source_id="lamp-1")
    assert item.error_stage == "length" and item.chosen == ""
    assert item.error.startswith("length ratio 3.") and "outside [0.8, 1.25]" in item.error
    assert item.outputs["generation"]["within_bounds"] is False and item.outputs["length_rounds"] == 1
    sent = len(fake_openai.requests)

    # Resume: regenerated with fresh seeds (not the cached answers); with a fair generator it passes.
    fake_openai.responder = lambda body: answer(body)
    build_resume(build=BuildRun.objects.get(pk=build.pk), enqueue=False)
    assert build_execute(build_id=build.pk) == BuildStatus.SUCCEEDED
    assert len(fake_openai.requests) > sent
    build.refresh_from_db()
    kept = build.items.get(source_id="lamp-1")
    assert 0.8 <= kept.outputs["generation"]["length_ratio"] <= 1.25 and build.benchmark.item_count == 6

    # Or drop it explicitly: the benchmark has only pairs inside the band.
    fake_openai.responder = lopsided
    other = new_build(staff_user, name="built-v2", planner="", planner_model="", seed=5)
    assert build_execute(build_id=other.pk) == BuildStatus.FAILED
    build_resume(build=BuildRun.objects.get(pk=other.pk), skip_failed=True, enqueue=False)
    assert build_execute(build_id=other.pk) == BuildStatus.SUCCEEDED
    other.refresh_from_db()
    assert other.benchmark.item_count == 5
    assert not other.benchmark.items.filter(source_id="lamp-1").exists()


@pytest.mark.django_db
def test_stored_str_format_templates_are_converted_to_jinja2_rendering_the_same_text():
    import importlib

    from django.apps import apps

    from pipeline.build import _as_ml_template
    from pipeline.models import PromptTemplate

    migration = importlib.import_module("pipeline.migrations.0010_areac_prompt_templates_jinja2")
    legacy = PromptTemplate.objects.create(name="old", purpose="chosen", version=1, system='JSON {{"a": 1}}',
                                           user="Q {question}\nP {profile}\nA {aspects} ({target_words})")
    broken = PromptTemplate.objects.create(name="broken", purpose="chosen", version=1, system="", user="{0}")
    migration.to_jinja(apps, None)
    legacy.refresh_from_db()
    broken.refresh_from_db()
    assert (legacy.system, legacy.user) == ('JSON {{ "{" }}"a": 1}', "Q {{ question }}\nP {{ profile }}\n"
                                                                      "A {{ aspects }} ({{ target_words }})")
    messages = _as_ml_template(legacy).render("Q?", ["p"], ["a"], target_words=9)
    assert [m["content"] for m in messages] == ['JSON {"a": 1}', "Q Q?\nP 1. p\nA 1. a (9)"]
    assert broken.user == "{0}"  # already unusable: left as it was, refused with its reason when used
