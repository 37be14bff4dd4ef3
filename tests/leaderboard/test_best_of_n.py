"""Best-of-N end to end on CPU: a tiny policy samples, a tiny scalar RM picks, a fake judge
grades against the rubric, outcomes per k land next to the random baseline."""

import json
import re

import pytest
from django.conf import settings
from django.core.management import CommandError, call_command
from django.test import Client

from leaderboard import services
from leaderboard.models import BestOfNRun, DownstreamOutcome, PPORun
from pipeline.models import Benchmark, LLMEndpoint, PolicySample, PolicySampleSet
from pipeline.services import benchmark_import
from tests.leaderboard.test_submissions import scores_upload
from tests.prblib.fake_openai import text
from tests.prblib.test_llm import save_tiny_causal_lm
from prblib.tiny_models import build_decoder_rm
from tests.pipeline.test_formats import make_row, write_jsonl

pytestmark = pytest.mark.django_db


def grade(body):
    """A judge that gives every aspect 2 for long answers and 0 for short ones."""
    user = body["messages"][-1]["content"]
    n = len(re.findall(r"^Aspect \d+: ", user, flags=re.M))
    answer = user.split("=== Answer ===")[1]
    score = 2 if len(answer.split()) > 12 else 0
    return "\n".join(f"Aspect {i}: {score}" for i in range(1, n + 1))


def tiny_world(researcher, fake_openai, tmp_path, *, items: int, aspects=("Mentions watercolour",)):
    """A tiny benchmark, a tiny random policy and scalar RM under MODELS_ROOT, a submission of
    that RM, and the fake endpoint as the rubric judge. Returns (submission, judge endpoint)."""
    rows = [make_row(i, rubric_aspects=[{"aspect": a} for a in aspects]) for i in range(items)]
    benchmark_import(path=write_jsonl(tmp_path / "b.jsonl", rows), name="tiny")
    save_tiny_causal_lm(settings.MODELS_ROOT / "policy", end_every=3)  # answers end: never truncated
    build_decoder_rm(settings.MODELS_ROOT / "rm")
    submission = services.submission_create(user=researcher, request=services.SubmissionRequest(
        display_name="tiny RM", benchmark="tiny", kind="scalar", settings=("profile",), model_path="rm"))
    fake_openai.responder = grade
    return submission, LLMEndpoint.objects.create(name="judge", base_url=fake_openai.base_url, max_retries=1)


def test_best_of_n_stores_outcomes_per_k_with_the_random_baseline(researcher, fake_openai, tmp_path, capsys):
    submission, _ = tiny_world(researcher, fake_openai, tmp_path, items=4,
                               aspects=("Mentions watercolour", "Budget"))

    args = ["run_best_of_n", "--submission", str(submission.pk), "--policy-model", "policy", "--policy", "tiny-policy",
            "--n", "3", "--judge-endpoint", "judge", "--judge-model", "grader"]
    call_command(*args)
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    # N = 3 is not a power of two: the k grid still ends with N, so the third sample is used.
    assert set(out["results"]["rm"]) == {"1", "2", "3"} and out["policy"] == "tiny-policy"
    assert PolicySample.objects.count() == 4 * 3  # 4 items x N=3, sampled once
    rm_rows = DownstreamOutcome.objects.filter(rm_name="tiny RM", domain="").order_by("k")
    assert [r.k for r in rm_rows] == [1, 2, 3] and all(0 <= r.outcome <= 2 for r in rm_rows)
    assert rm_rows[0].submission == submission and rm_rows[0].n == 4
    assert DownstreamOutcome.objects.filter(rm_name=services.RANDOM_BASELINE, domain="").count() == 3
    assert {r.setting for r in rm_rows} == {"profile"}
    manifest = BestOfNRun.objects.get().results["manifest"]
    assert (manifest["policy"], manifest["n"], manifest["seed"], manifest["setting"]) == ("tiny-policy", 3, 0, "profile")
    submission.refresh_from_db()  # the worker hashed the weights (first use of the submission)
    assert len(submission.weights_hash) == 64
    assert manifest["weights_hash"] == submission.weights_hash and manifest["code_version"]
    assert manifest["templates"] == {"policy": "policy@v1", "rubric_judge": "rubric-judge@v1"}
    # Every outcome row of the RM records the run's manifest; the random baseline's (a row of no
    # submission, shared by every RM, so public) records it without the RM's identity.
    assert manifest["run"]["type"] == "best_of_n" and DownstreamOutcome.objects.count() > 3
    assert all(row.manifest == manifest for row in rm_rows)
    baseline = [row.manifest for row in DownstreamOutcome.objects.filter(rm_name=services.RANDOM_BASELINE)]
    assert baseline and all(m == baseline[0] for m in baseline)
    assert set(manifest) - set(baseline[0]) == {"rm_submission", "weights_hash", "rm_kind", "rm_options", "run"}
    assert submission.weights_hash not in json.dumps(baseline[0]) and baseline[0]["policy"] == "tiny-policy"
    # No prompt to the judge carries the narrative; the policy never sees the rubric (local model).
    assert all("Wants medium-specific tips" not in json.dumps(r["body"]) for r in fake_openai.requests)

    # A second RM reuses the samples and every judgement already paid for.

    build_decoder_rm(settings.MODELS_ROOT / "rm2", seed=7)
    other = services.submission_create(user=researcher, request=services.SubmissionRequest(
        display_name="tiny RM 2", benchmark="tiny", kind="scalar", settings=("profile",), model_path="rm2"))
    call_command(*[a if a != str(submission.pk) else str(other.pk) for a in args])
    assert PolicySampleSet.objects.count() == 1 and PolicySample.objects.count() == 12
    prompts = [r["body"]["messages"][-1]["content"] for r in fake_openai.requests]
    assert len(prompts) == len(set(prompts)) <= 12  # no sample was ever judged twice
    assert BestOfNRun.objects.filter(status="SUCCEEDED").count() == 2
    other.refresh_from_db()
    assert not any(h in json.dumps(row.manifest) for h in (submission.weights_hash, other.weights_hash)
                   for row in DownstreamOutcome.objects.filter(submission=None))


def test_the_submission_page_lists_its_downstream_outcomes(client, researcher, tmp_path):
    bench = benchmark_import(path=write_jsonl(tmp_path / "b.jsonl", [make_row(1)]), name="one").benchmark
    submission = services.submission_create(user=researcher, request=services.SubmissionRequest(
        display_name="rm", benchmark="one", kind="scores", settings=("profile",), scores_file=scores_upload(bench)))
    DownstreamOutcome.objects.create(rm_name="rm", submission=submission, kind="best_of_n", k=16, outcome=1.234, n=9)
    client.force_login(researcher)
    html = client.get(f"/submissions/{submission.pk}/").content.decode()
    assert 'id="outcome-table"' in html and "1.234" in html


@pytest.mark.django_db(transaction=True)
def test_best_of_n_runs_on_a_worker_from_the_admin(client, staff_user, researcher, fake_openai, tmp_path,
                                                   celery_worker_process):
    from tests.conftest import wait_for_job

    submission, judge = tiny_world(researcher, fake_openai, tmp_path, items=2)
    sample_set = PolicySampleSet.objects.create(benchmark=submission.benchmark, policy="tiny", model="policy", n=2)
    client.force_login(staff_user)
    client.post("/admin/pipeline/policysampleset/", {"action": "sample_on_worker", "_selected_action": [sample_set.pk]})
    wait_for_job(sample_set, worker=celery_worker_process, what="sampling on the worker", timeout=120)
    run = BestOfNRun.objects.create(submission=submission, sample_set=sample_set, judge=judge, judge_model="grader")
    client.post("/admin/leaderboard/bestofnrun/", {"action": "run_on_worker", "_selected_action": [run.pk]})
    wait_for_job(run, worker=celery_worker_process, what="Best-of-N on the worker", timeout=120)
    assert DownstreamOutcome.objects.filter(rm_name="tiny RM", domain="").count() == 2  # k = 1, 2


def test_ppo_trains_a_tiny_policy_and_stores_a_ppo_outcome(researcher, fake_openai, tmp_path):
    submission, _ = tiny_world(researcher, fake_openai, tmp_path, items=10)
    call_command("run_ppo", "--submission", str(submission.pk), "--policy-model", "policy", "--policy", "tiny",
                 "--judge-endpoint", "judge", "--judge-model", "grader", "--steps", "2", "--batch-size", "2",
                 "--response-length", "8", "--eval-fraction", "0.3")
    outcome = DownstreamOutcome.objects.get(rm_name="tiny RM", kind="ppo", domain="")
    assert outcome.k is None and outcome.policy == "tiny" and outcome.n >= 1 and 0 <= outcome.outcome <= 2
    run = PPORun.objects.get()
    assert run.status == "SUCCEEDED" and run.results["training"]["algorithm"] == "ppo"
    assert run.results["training"]["steps"] == 2
    # The policy's answers end at an end token (end_every=3): none was cut at the cap.
    assert run.results["answers"] == {"n": run.answers.count(), "truncated": 0} and run.answers.count() >= 1
    assert not run.answers.filter(truncated=True).exists()


def test_run_ppo_knobs_are_validated_stored_recorded_and_reach_the_trainer(researcher, fake_openai, tmp_path,
                                                                          monkeypatch):
    submission, _ = tiny_world(researcher, fake_openai, tmp_path, items=10)
    base = ["run_ppo", "--submission", str(submission.pk), "--policy-model", "policy", "--policy", "tiny",
            "--judge-endpoint", "judge", "--judge-model", "grader"]
    with pytest.raises(CommandError, match=r"option 'lr' is not an option of a ppo run \(allowed: steps, "):
        call_command(*base, "--option", "lr=0.1")
    with pytest.raises(CommandError, match=r"option 'kl_coef': Input should be greater than or equal to 0"):
        call_command(*base, "--option", "kl_coef=-1")
    with pytest.raises(CommandError, match="batch_size 6 is not a multiple of mini_batches 4"):
        call_command(*base, "--batch-size", "6", "--option", "mini_batches=4")
    with pytest.raises(CommandError, match="--steps 3 and --option steps=2 disagree"):
        call_command(*base, "--steps", "3", "--option", "steps=2")
    assert not PPORun.objects.exists()

    # Every first training of a run goes through train_ppo: seen here with the knobs it was given.
    from prblib.downstream import ppo

    given = []
    real = ppo.train_ppo
    monkeypatch.setattr(ppo, "train_ppo", lambda **kw: given.append(kw) or real(**kw))
    call_command(*base, "--steps", "2", "--batch-size", "2", "--eval-fraction", "0.3",
                 "--option", "response_length=8", "--option", "kl_coef=0.2", "--option", "learning_rate=1e-4",
                 "--option", "vf_coef=0.5", "--option", "reward_scale=2", "--option", "ppo_epochs=1")
    run = PPORun.objects.get()
    assert (run.steps, run.batch_size, run.response_length, run.eval_fraction) == (2, 2, 8, 0.3)
    assert run.options["kl_coef"] == 0.2 and run.options["cliprange"] == 0.2  # stored with every default
    assert {k: given[0][k] for k in ("kl_coef", "learning_rate", "vf_coef", "ppo_epochs")} == \
        {"kl_coef": 0.2, "learning_rate": 1e-4, "vf_coef": 0.5, "ppo_epochs": 1}
    trained = run.results["training"]["settings"]  # what train_ppo handed to TRL's PPOConfig
    assert (trained["kl_coef"], trained["learning_rate"], trained["vf_coef"]) == (0.2, 1e-4, 0.5)
    # reward_scale multiplies the RM's score before TRL sees it: 2x the unscaled scorer's value.
    module, key = given[0]["reward"], given[0]["reward_prompts"][0]
    scaled, unscaled = module.score_texts([(key, "An answer.")]), module.score_texts.__wrapped__([(key, "An answer.")])
    assert scaled == [2 * unscaled[0]] and unscaled[0] != 0
    client = Client()
    client.force_login(researcher)
    page = client.get(f"/submissions/{submission.pk}/").content.decode()
    assert "Downstream runs and their knobs" in page and "<code>kl_coef</code>" in page and ">0.2<" in page
    recorded = run.results["manifest"]  # every knob, defaults included
    assert recorded["kl_coef"] == 0.2 and recorded["steps"] == 2 and recorded["reward_scale"] == 2


def test_a_redelivered_ppo_run_reuses_its_trained_policy(researcher, fake_openai, tmp_path, monkeypatch):
    """The trained policy is the training unit: once in the run's folder, a redelivery (or a
    retry) answers with it and never trains again."""
    from prblib.downstream import ppo

    submission, judge = tiny_world(researcher, fake_openai, tmp_path, items=10)
    run = services.ppo_run_create(submission=submission, policy="tiny", policy_model="policy", judge=judge,
                                  judge_model="grader", setting="profile",
                                  options={"steps": 1, "batch_size": 2, "response_length": 8, "eval_fraction": 0.3})
    assert services.ppo_run_here(run=run) == "SUCCEEDED"
    first = PPORun.objects.get(pk=run.pk).results["training"]
    assert first["out_dir"] == str(settings.VAR_DIR / "ppo" / f"{services.ppo_run_key(run)}-policy")

    def must_not_train(**kwargs):
        raise AssertionError("trained again")

    monkeypatch.setattr(ppo, "train_ppo", must_not_train)
    run.answers.all().delete()  # as if the worker died before answering
    PPORun.objects.filter(pk=run.pk).update(status="FAILED")
    assert services.ppo_run_here(run=run) == "SUCCEEDED", PPORun.objects.get(pk=run.pk).error
    again = PPORun.objects.get(pk=run.pk).results["training"]
    assert again["out_dir"] == first["out_dir"] and again["stats"] == first["stats"]
    assert run.answers.filter(judged=True).count() == run.answers.count() > 0


def test_ppo_refuses_uploaded_scores_which_cannot_score_new_answers(researcher, fake_openai, tmp_path):
    bench = benchmark_import(path=write_jsonl(tmp_path / "b.jsonl", [make_row(i) for i in range(4)]),
                             name="tiny").benchmark
    submission = services.submission_create(user=researcher, request=services.SubmissionRequest(
        display_name="scores", benchmark="tiny", kind="scores", settings=("profile",), scores_file=scores_upload(bench)))
    judge = LLMEndpoint.objects.create(name="judge", base_url=fake_openai.base_url)
    run = PPORun.objects.create(submission=submission, policy_model="policy", judge=judge, judge_model="m")
    assert services.ppo_run_execute(run_id=run.pk) == "FAILED"
    run.refresh_from_db()
    assert "uploaded scores cannot score new answers" in run.error


def test_best_of_n_refuses_uploaded_scores_before_scoring_any_sample(researcher, fake_openai, tmp_path):
    """Registry flag `scores_new_answers` False: refused up front, with the reason, not by a
    scoring error on the first sample."""
    bench = benchmark_import(path=write_jsonl(tmp_path / "b.jsonl", [make_row(i) for i in range(4)]),
                             name="tiny").benchmark
    submission = services.submission_create(user=researcher, request=services.SubmissionRequest(
        display_name="scores", benchmark="tiny", kind="scores", settings=("profile",), scores_file=scores_upload(bench)))
    sample_set = PolicySampleSet.objects.create(benchmark=bench, policy="tiny", model="policy", n=2, status="SUCCEEDED")
    judge = LLMEndpoint.objects.create(name="judge", base_url=fake_openai.base_url)
    run = BestOfNRun.objects.create(submission=submission, sample_set=sample_set, judge=judge, judge_model="m")
    assert services.bon_run_execute(run_id=run.pk) == "FAILED"
    run.refresh_from_db()
    assert "uploaded scores cannot score new answers: Best-of-N needs a model" in run.error
    assert fake_openai.requests == [] and not DownstreamOutcome.objects.exists()


def test_ppo_trains_against_a_generative_judge_through_the_text_reward_module(researcher, fake_openai, tmp_path):
    """A pointwise judge scores the policy's decoded answer and the pair's rejected answer; the
    reward is the margin. The judge and the outcome grader share the fake endpoint here."""
    rows = [make_row(i, rubric_aspects=[{"aspect": "Mentions watercolour"}]) for i in range(10)]
    benchmark_import(path=write_jsonl(tmp_path / "b.jsonl", rows), name="tiny")
    save_tiny_causal_lm(settings.MODELS_ROOT / "policy", end_every=3)  # answers end: never truncated
    endpoint = LLMEndpoint.objects.create(name="judge", base_url=fake_openai.base_url, max_retries=1)

    def respond(body):
        user = body["messages"][-1]["content"]
        if "=== Answer ===" in user and "Aspect 1:" in user:
            return grade(body)
        return f"Score: {min(10, 1 + len(user) % 10)}"  # the pointwise judge

    fake_openai.responder = respond
    submission = services.submission_create(user=researcher, request=services.SubmissionRequest(
        display_name="pointwise judge", benchmark="tiny", kind="pointwise", settings=("profile",),
        judge_backend="judge", model_path="judge-model"))
    run = PPORun.objects.create(submission=submission, policy="tiny", policy_model="policy", judge=endpoint,
                                judge_model="grader", steps=2, batch_size=2, response_length=8, eval_fraction=0.3)
    assert services.ppo_run_execute(run_id=run.pk) == "SUCCEEDED", PPORun.objects.get(pk=run.pk).error
    assert DownstreamOutcome.objects.filter(rm_name="pointwise judge", kind="ppo", domain="").exists()
    pointwise = [r["body"]["messages"][-1]["content"] for r in fake_openai.requests
                 if "Aspect 1:" not in r["body"]["messages"][-1]["content"]]
    # During training the judge scored decoded policy answers and the rejected reference answers.
    assert any(make_row(0)["rejected"] in text for text in pointwise)
    assert len(pointwise) >= 2 * 2 * 2  # 2 steps x batch 2 x (response + reference)


def test_the_pairwise_reward_is_the_margin_over_the_reference_and_none_on_failure():
    from prblib.rewards.base import PairResult, ScoreInput
    from prblib.downstream.ppo import pairwise_scorer

    class StubJudge:
        def score_pairs(self, pairs, *, setting):
            for p in pairs:
                good = None if "unreadable" in p.chosen else (3.0 if "good" in p.chosen else 1.0)
                yield PairResult(p.id, good, 2.0)

    contexts = {"q1": ScoreInput(id="q1", question="Q?", responses=())}
    score = pairwise_scorer(StubJudge(), setting="profile", contexts=contexts, references={"q1": "ref"})
    assert score([("q1", "a good answer"), ("q1", "a bad answer"), ("q1", "unreadable")]) == [1.0, -1.0, None]


def test_run_best_of_n_sampling_knobs_reach_the_endpoint_and_the_manifest(researcher, fake_openai, tmp_path):
    submission, _ = tiny_world(researcher, fake_openai, tmp_path, items=3)
    LLMEndpoint.objects.create(name="policy", base_url=fake_openai.base_url, max_retries=0)
    base = ["run_best_of_n", "--submission", str(submission.pk), "--policy-model", "m", "--policy-endpoint", "policy",
            "--judge-endpoint", "judge", "--judge-model", "grader"]
    with pytest.raises(CommandError, match=r"option 'top_p': Input should be less than or equal to 1"):
        call_command(*base, "--option", "top_p=1.5")
    with pytest.raises(CommandError, match=r"option 'top_k' is not an option of a best-of-n run"):
        call_command(*base, "--option", "top_k=5")

    def respond(body):
        if "=== Answer ===" in body["messages"][-1]["content"]:
            return grade(body)
        return text([f"Sample {i}, a long enough answer about watercolour painting for the judge here."
                     for i in range(body.get("n") or 1)])

    fake_openai.responder = respond
    call_command(*base, "--n", "2", "--option", "top_p=0.9", "--option", "max_new_tokens=64",
                 "--option", "temperature=1")
    sampling = [b for b in fake_openai.bodies if "=== Answer ===" not in b["messages"][-1]["content"]]
    assert sampling and all((b["top_p"], b["max_tokens"], b["temperature"], b["n"]) == (0.9, 64, 1, 2)
                            for b in sampling)
    assert all("top_p" not in b for b in fake_openai.bodies if b not in sampling)  # the judge is left alone
    manifest = BestOfNRun.objects.get().results["manifest"]
    assert (manifest["top_p"], manifest["max_new_tokens"], manifest["temperature"], manifest["n"]) == (0.9, 64, 1, 2)


def test_best_of_n_with_a_generative_judge_as_the_rm(researcher, fake_openai, tmp_path, capsys):
    tiny_world(researcher, fake_openai, tmp_path, items=3)

    def respond(body):
        user = body["messages"][-1]["content"]
        return grade(body) if "Aspect 1:" in user else f"Score: {1 + len(user) % 10}"

    fake_openai.responder = respond
    judge_rm = services.submission_create(user=researcher, request=services.SubmissionRequest(
        display_name="judge RM", benchmark="tiny", kind="pointwise", settings=("profile",), judge_backend="judge",
        model_path="judge-model"))
    call_command("run_best_of_n", "--submission", str(judge_rm.pk), "--policy-model", "policy", "--n", "2",
                 "--judge-endpoint", "judge", "--judge-model", "grader")
    assert DownstreamOutcome.objects.filter(rm_name="judge RM", domain="").count() == 2  # k = 1, 2


def test_on_pair_history_benchmarks_the_policy_sees_the_earlier_preferences(fake_openai, tmp_path):
    from pipeline.downstream import samples_generate
    from tests.pipeline.test_pair_history import history_row

    benchmark_import(path=write_jsonl(tmp_path / "p.jsonl", [history_row(0)]), name="prism-like")
    # Distinct samples, as a sampling policy gives (identical ones are degenerate: asked again, then refused).
    fake_openai.responder = lambda body: text([f"Try a quiet garden walk, way {i}." for i in range(body["n"])])
    endpoint = LLMEndpoint.objects.create(name="policy", base_url=fake_openai.base_url, max_retries=1)
    sample_set = PolicySampleSet.objects.create(benchmark=Benchmark.objects.get(name="prism-like"), policy="p",
                                                endpoint=endpoint, model="m", n=2)
    assert samples_generate(sample_set=sample_set) == "SUCCEEDED"
    prompt = json.dumps(fake_openai.requests[0]["body"]["messages"])
    assert "Preferred: A quiet documentary." in prompt and sample_set.samples.count() == 2
