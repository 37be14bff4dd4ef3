"""Every model preset end to end (issue 30): submitted by name (service, form and API), run by the
worker's code (`run_execute`, what the Celery task calls), on the leaderboard and in the paper's table,
with the family's own prompt and answer format. Expected accuracies are fixed by hand in preset_cases."""

import json

import pytest
from django.conf import settings
from django.urls import reverse

from leaderboard import services
from leaderboard.selectors import leaderboard_rows
from leaderboard.paper import paper_table
from pipeline.models import BenchmarkItem, LLMEndpoint
from pipeline.services import benchmark_import
from tests.leaderboard import preset_cases as cases

pytestmark = pytest.mark.django_db


@pytest.fixture
def world(researcher, fake_openai, tmp_path):
    benchmark_import(path=cases.benchmark_file(tmp_path), name="presets")
    fake_openai.responder = cases.responder
    LLMEndpoint.objects.create(name="judge", base_url=fake_openai.base_url, max_retries=0, max_concurrency=4)
    # A hosted API declared once by the operator: its parameter names and the one model it may bill.
    LLMEndpoint.objects.create(name="hosted", base_url=fake_openai.base_url, max_retries=0,
                               token_parameter="max_completion_tokens", accepts_temperature=False,
                               allowed_models=["openai-compatible-judge"])
    return researcher


def submit_preset(user, name: str, *, settings_=("no_profile",)):
    judge = name in cases.JUDGE_CASES
    if not judge:
        cases.build_scalar(settings.MODELS_ROOT / f"tiny-{name}", cases.SCALAR_CASES[name])
    return services.submission_create(user=user, request=services.SubmissionRequest(
        display_name=f"tiny {name}", benchmark="presets", kind="", preset=name, settings=settings_,
        model_path=name if judge else f"tiny-{name}",
        judge_backend=("hosted" if name == "openai-compatible-judge" else "judge") if judge else "",
        options=cases.EXTRA_OPTIONS.get(name), max_length=2048))


def run_all(submission):
    for run in submission.runs.all():
        assert services.run_execute(run_id=run.pk) == "SUCCEEDED", run.error
    assert services.submission_publish(user=submission.owner, submission=submission)
    return {run.setting: run for run in submission.runs.all()}


ALL_PRESETS = [*cases.SCALAR_CASES, *cases.JUDGE_CASES]


@pytest.mark.parametrize("name", ALL_PRESETS)
def test_each_preset_runs_end_to_end_in_its_own_format(world, fake_openai, client, name):
    from prblib.rewards import presets

    entry = presets.preset(name)
    submission = submit_preset(world, name)
    # The preset fixed the kind and stored what it set, under the explicit options.
    assert submission.kind == entry.kind
    assert submission.options == {**entry.options, **cases.EXTRA_OPTIONS.get(name, {}), "model_preset": name}
    run = run_all(submission)["no_profile"]

    if name in cases.JUDGE_CASES:
        expected = cases.JUDGE_EXPECTED
        assert run.metrics["accuracy"] == pytest.approx(expected["all"])
        for domain in ("arts_entertainment", "lifestyle_personal_development", "society_culture"):
            assert run.metrics["by_domain"][domain]["accuracy"] == pytest.approx(expected[domain])
        bodies = [r["body"] for r in fake_openai.requests]
        assert bodies and all(b["model"] == name for b in bodies)
        text = json.dumps(bodies[0])
        if name.startswith("rm-r1"):
            assert "<answer>[[A]]</answer>" in text and bodies[0]["max_tokens"] == entry.options["max_tokens"]
        if name.startswith("r3"):
            assert "### Evaluation rubric" in text and '\\"score\\"' in text
        if name == "openai-compatible-judge":  # the endpoint's declared parameters, not ours
            assert bodies[0]["max_completion_tokens"] == 4096
            assert "max_tokens" not in bodies[0] and "temperature" not in bodies[0]
        assert run.metrics["manifest"]["options"]["model_preset"] == name
    else:
        items = BenchmarkItem.objects.filter(benchmark__name="presets").order_by("position")
        reference = cases.reference_scalar_scores(settings.MODELS_ROOT / f"tiny-{name}",
                                                  [(i.source_id, i.question, (i.chosen, i.rejected)) for i in items])
        stored = {s.item.source_id: s.chosen_score - s.rejected_score for s in run.pair_scores.select_related("item")}
        assert stored == pytest.approx(reference, abs=1e-4)
        assert run.metrics["accuracy"] == pytest.approx(sum(d > 0 for d in reference.values()) / 12)

    # The leaderboard and the paper table show it, in its RM type's group.
    [row] = [r for r in leaderboard_rows(benchmark="presets") if r["submission_id"] == submission.pk]
    assert row["accuracy"] == run.metrics["accuracy"]
    table = paper_table(benchmark="presets")
    [group] = [g for g in table["groups"] if any(r["submission_id"] == submission.pk for r in g["rows"])]
    assert group["rm_type"] == entry.rm_type
    [paper_row] = group["rows"]
    assert paper_row["preset"] == name and paper_row["cells"]["no_profile"]["all"]["accuracy"] == row["accuracy"]
    page = client.get(reverse("leaderboard:paper") + "?benchmark=presets").content.decode()
    assert f"tiny {name}" in page and f"{100 * row['accuracy']:.1f}" in page


def test_a_preset_is_chosen_on_the_form_and_the_api_and_refused_when_it_does_not_fit(world, client):
    client.force_login(world)
    response = client.post(reverse("leaderboard:submit"), {
        "display_name": "R3 from the form", "benchmark": "presets", "preset": "r3-binary", "kind": "",
        "settings": ["no_profile"], "judge_backend": "judge", "model_path": "r3-binary", "dtype": "auto",
        "max_length": 2048, "batch_size": 8, "profile_k": 10})
    assert response.status_code == 302, response.content.decode()[:2000]
    made = world.submissions.get(display_name="R3 from the form")
    assert made.kind == "pointwise" and made.options["prompt_format"] == "r3-binary"

    api = client.post("/api/submissions/", {
        "display_name": "RM-R1 via API", "benchmark": "presets", "preset": "rm-r1-instruct", "settings": ["no_profile"],
        "judge_backend": "judge", "model_path": "rm-r1-instruct", "options": {"max_tokens": 2048}},
        content_type="application/json")
    assert api.status_code == 201, api.json()
    assert api.json()["kind"] == "pairwise" and api.json()["options"]["max_tokens"] == 2048  # explicit wins
    assert api.json()["options"]["answer_parser"] == "rm_r1"

    refused = client.post("/api/submissions/", {
        "display_name": "wrong kind", "benchmark": "presets", "preset": "rm-r1-instruct", "kind": "scalar",
        "settings": ["no_profile"], "model_path": "x"}, content_type="application/json")
    assert refused.status_code == 400
    assert refused.json()["preset"] == ["Preset 'rm-r1-instruct' runs as the pairwise kind, not scalar."]
    hosted = client.post("/api/submissions/", {
        "display_name": "hosted without endpoint", "benchmark": "presets", "preset": "openai-compatible-judge",
        "settings": ["no_profile"], "model_path": "gpt"}, content_type="application/json")
    assert hosted.status_code == 400
    assert "runs on a judge backend configured by staff" in hosted.json()["judge_backend"][0]
    unknown = client.post("/api/submissions/", {"display_name": "u", "benchmark": "presets", "preset": "nope",
                                                "settings": ["no_profile"]}, content_type="application/json")
    assert unknown.status_code == 400 and "preset" in unknown.json()
    nothing = client.post("/api/submissions/", {"display_name": "n", "benchmark": "presets",
                                                "settings": ["no_profile"]}, content_type="application/json")
    assert nothing.status_code == 400 and nothing.json()["kind"] == ["Choose a kind, or a preset."]


def test_evaluate_rm_takes_a_preset(world, tmp_path):
    from django.core.management import call_command

    out = tmp_path / "out.txt"
    call_command("evaluate_rm", "--benchmark", "presets", "--preset", "r3-pairwise", "--setting", "no_profile",
                 "--model", "r3-pairwise", "--endpoint", "judge", stdout=open(out, "w"))
    summary = json.loads(out.read_text().strip().splitlines()[-1])
    assert summary["kind"] == "pairwise" and summary["accuracy"] == pytest.approx(8 / 12)
    assert summary["manifest"]["templates"] == {"judge": "r3-pairwise@v1"}
    assert summary["manifest"]["options"]["model_preset"] == "r3-pairwise"


def test_the_supported_models_page_lists_every_preset_with_what_it_sets(client):
    from prblib.rewards import presets

    page = client.get(reverse("leaderboard:supported-models")).content.decode()
    for entry in presets.PRESETS:
        assert f'id="preset-{entry.name}"' in page
    assert "convert_internlm2" in page and "rm_r1" in page and "r3_binary" in page
    assert "max_completion_tokens" in page  # the hosted preset says where its parameters come from
    home = client.get(reverse("home")).content.decode()
    assert reverse("leaderboard:supported-models") in home  # the footer
    assert f'href="{reverse("leaderboard:paper")}" id="paper-table-link"' in home  # beside the leaderboard
