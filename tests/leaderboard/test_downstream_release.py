"""Best-of-N and PPO under protocol "release" (issue 27): the figure the authors' scripts compute,
worked out here by an independent implementation of their rules (written from docs/protocols.md's
description of BoN/sample.py, BoN/score.py, BoN/evaluate.py, PPO/reward_function.py), on the same
model outputs (a fake endpoint whose samples and judge replies the test writes), equals ours under
protocol=release; ours under protocol=prbench is printed beside it."""

import json
import re

import pytest
import torch
from django.conf import settings
from django.core.management import CommandError, call_command

from leaderboard import services
from leaderboard.models import BestOfNRun, PPORun
from pipeline.models import LLMEndpoint
from pipeline.services import benchmark_import
from tests.prblib.fake_openai import text
from tests.prblib.test_llm import save_tiny_causal_lm
from prblib.tiny_models import build_decoder_rm
from tests.pipeline.test_formats import make_row, write_jsonl

pytestmark = pytest.mark.django_db

ITEMS = 3
ASPECTS = ("Mentions watercolour", "Budget")
POSTS = 12  # more than the release's 10, so the cut shows


def row(i: int) -> dict:
    return make_row(i, rubric_aspects=[{"aspect": a} for a in ASPECTS],
                    profile=[{"id": f"u{i}-p{j}", "text": f"Post text {j} of user {i}.", "category": f"Cat{j % 3}"}
                             for j in range(POSTS)])


def sample_text(item: int, j: int) -> str:
    return f"Answer {j} for user {item}: " + " ".join(["paint"] * (1 + (7 * j + item) % 5))


# The rubric judge's replies, by sample index: a list, a list with words around it, bare numbers, none at all.
RELEASE_REPLIES = ("[2, 1]", "Scores: [1, 1] (fair)", "I give 2 then 0", "No scores here.")


def responder(body: dict):
    system = body["messages"][0]["content"]
    user = body["messages"][-1]["content"]
    if system.startswith("You are a helpful assistant. You answer a question"):  # the policy
        item = int(re.search(r"question (\d+)\?", user).group(1))
        return text([sample_text(item, j) for j in range(int(body.get("n") or 1))])
    j = int(re.search(r"Answer (\d+) for user", user).group(1))
    if "bracketed list" in user:  # the release's list judge
        return RELEASE_REPLIES[j % 4]
    # Ours: "Aspect N: S" lines, unreadable for every third sample (dropped from our mean).
    return "I cannot grade this." if j % 3 == 0 else f"Aspect 1: {j % 3}\nAspect 2: 2"


# -- the release's rules, written here from their description -------------------------------------

def release_profile(posts: list[dict]) -> str:
    out = ""
    for number, post in enumerate(posts[:10], start=1):
        if number > 1:
            out += "\n"
        out += "Post " + str(number) + " (Category: " + post["category"] + "):\n" + post["text"]
    return out


def release_grade(reply: str) -> float:
    """Numbers inside the first [...] of the stripped reply, else anywhere in it; their mean; 0 if none."""
    reply = reply.strip()
    start = reply.find("[")
    end = reply.find("]", start + 1) if start >= 0 else -1
    region = reply[start + 1:end] if start >= 0 and end > start + 1 else reply
    numbers = [float(n) for n in re.findall(r"-?[0-9]+\.?[0-9]*", region)]
    return sum(numbers) / len(numbers) if numbers else 0.0


class ReleaseRM:
    """BoN/score.py's discriminative scorer: [user = query + profile, assistant = answer] through the chat
    template as text, tokenized with the tokenizer's defaults, softmax over the labels, its last entry."""

    def __init__(self, folder):
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(folder)
        self.model = AutoModelForSequenceClassification.from_pretrained(folder, dtype=torch.float32).eval()

    def __call__(self, user: str, answer: str) -> float:
        text = self.tokenizer.apply_chat_template([{"role": "user", "content": user},
                                                   {"role": "assistant", "content": answer}], tokenize=False)
        with torch.no_grad():
            logits = self.model(**self.tokenizer(text, return_tensors="pt")).logits[0]
        return torch.softmax(logits, dim=-1)[-1].item()


def release_best_of_n(rm: ReleaseRM, ks: list[int], n: int) -> dict[int, float]:
    """Per k: the mean over items of the judge's grade of the first maximum among samples 0..k-1."""
    per_k = {}
    for k in ks:
        grades = []
        for i in range(ITEMS):
            r = row(i)
            scores = [rm(r["question"] + release_profile(r["profile"]), sample_text(i, j)) for j in range(k)]
            best = scores.index(max(scores))  # the first maximum, as Python's max over (score, sample) pairs
            grades.append(release_grade(RELEASE_REPLIES[best % 4]))
        per_k[k] = sum(grades) / len(grades)
    return per_k


@pytest.fixture
def world(researcher, fake_openai, tmp_path):
    benchmark_import(path=write_jsonl(tmp_path / "b.jsonl", [row(i) for i in range(ITEMS)]), name="tiny")
    folder = build_decoder_rm(settings.MODELS_ROOT / "rm", num_labels=2, id2label={0: "chosen", 1: "rejected"},
                              seed=3)
    submission = services.submission_create(user=researcher, request=services.SubmissionRequest(
        display_name="tiny RM", benchmark="tiny", kind="scalar", settings=("profile",), model_path="rm"))
    fake_openai.responder = responder
    LLMEndpoint.objects.create(name="fake", base_url=fake_openai.base_url, max_retries=1)
    return submission, folder


def run_bon(submission, capsys, *options: str) -> dict:
    call_command("run_best_of_n", "--submission", str(submission.pk), "--policy-model", "policy-model",
                 "--policy-endpoint", "fake", "--judge-endpoint", "fake", "--judge-model", "grader",
                 *[a for o in options for a in ("--option", o)])
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])["results"]


def test_best_of_n_release_equals_the_release_rule_on_the_same_outputs(world, fake_openai, capsys):
    submission, folder = world
    released = run_bon(submission, capsys, "protocol=release")
    run = BestOfNRun.objects.get(protocol="release")
    sampled = run.sample_set
    assert (sampled.n, sampled.temperature, sampled.top_p, sampled.max_tokens) == (16, 1.0, 0.9, 512)
    assert run.setting == "no_profile" and released["manifest"]["protocol"] == "release"
    assert released["manifest"]["templates"]["rubric_judge"] == "rubric-judge-release@v1"
    judge_bodies = [r["body"] for r in fake_openai.requests if "bracketed list" in r["body"]["messages"][-1]["content"]]
    assert judge_bodies and {(b["max_tokens"], b["temperature"]) for b in judge_bodies} == {(32, 0.0)}

    ks = [1, 2, 4, 8, 16]
    expected = release_best_of_n(ReleaseRM(folder), ks, 16)
    ours = run_bon(submission, capsys)  # protocol prbench: our sampling defaults, our judge, profile setting
    for k in ks:
        print(f"\nPROTOCOL | best_of_n k={k} | release rule (independent) {expected[k]:.4f} | ours protocol=release "
              f"{released['rm'][str(k)]['mean']:.4f} | ours protocol=prbench {ours['rm'][str(k)]['mean']} "
              f"(n {ours['rm'][str(k)]['n']}, {ours['rm'][str(k)]['failures']} unread dropped)")
        assert released["rm"][str(k)]["mean"] == expected[k]
        # An unreadable answer scores 0 and stays in the mean: n is every item at every k.
        assert (released["rm"][str(k)]["n"], released["rm"][str(k)]["failures"]) == (ITEMS, 0)
    assert any(ours["rm"][str(k)]["failures"] for k in ks)  # ours drops unread verdicts instead


def test_best_of_n_release_refuses_a_changed_knob(world, capsys):
    submission, _ = world
    with pytest.raises(CommandError, match=r"option 'temperature' is 0\.8 but protocol 'release' runs the authors' "
                                           r"value 1\.0"):
        run_bon(submission, capsys, "protocol=release", "temperature=0.8")
    assert not BestOfNRun.objects.exists()


def test_ppo_release_knobs_and_reward_equal_the_release_s(world, researcher, monkeypatch, tmp_path):
    """PPO/verl.sh's knobs reach the trainer, and the reward of a rollout is the release's: the RM's
    softmax[-1] on question + profile text, divided by 10 (PPO/reward_function.py)."""
    submission, folder = world
    from prblib.downstream import ppo

    # The release's batch of 128 needs 128 training questions: a second benchmark of them.
    benchmark_import(path=write_jsonl(tmp_path / "big.jsonl", [row(i) for i in range(170)]), name="big")
    big = services.submission_create(user=researcher, request=services.SubmissionRequest(
        display_name="tiny RM big", benchmark="big", kind="scalar", settings=("profile",), model_path="rm"))
    save_tiny_causal_lm(settings.MODELS_ROOT / "policy", end_every=3)
    given = []

    class Stop(Exception):
        pass

    def capture(**kwargs):
        given.append(kwargs)
        raise Stop

    monkeypatch.setattr(ppo, "train_ppo", capture)
    run = services.ppo_run_create(submission=big, policy="tiny", policy_model="policy",
                                  judge=LLMEndpoint.objects.get(name="fake"), judge_model="grader",
                                  setting="profile", options={"protocol": "release"})
    try:
        services.ppo_run_here(run=run)
    except Stop:
        pass
    knobs = given[0]
    assert {k: knobs[k] for k in ("batch_size", "mini_batches", "ppo_epochs", "learning_rate", "critic_learning_rate",
                                  "response_length", "temperature", "kl_coef", "gamma", "lam", "cliprange",
                                  "cliprange_value", "weight_decay", "lr_schedule")} == {
        "batch_size": 128, "mini_batches": 8, "ppo_epochs": 1, "learning_rate": 5e-7, "critic_learning_rate": 5e-6,
        "response_length": 512, "temperature": 1.0, "kl_coef": 0.0, "gamma": 1.0, "lam": 1.0, "cliprange": 0.2,
        "cliprange_value": 0.5, "weight_decay": 0.01, "lr_schedule": "constant"}
    stored = PPORun.objects.get()
    assert stored.options["protocol"] == "release" and stored.setting == "no_profile"

    rm = ReleaseRM(folder)
    module, keys = knobs["reward"], knobs["reward_prompts"][:2]
    by_id = {r["id"]: r for r in (row(i) for i in range(170))}
    answers = ["Try wet-on-wet washes.", "Practise every day."]
    expected = [rm(by_id[key]["question"] + release_profile(by_id[key]["profile"]), a) / 10
                for key, a in zip(keys, answers)]
    ours = module.score_texts(list(zip(keys, answers)))
    print(f"\nPROTOCOL | ppo reward | release rule (independent) {expected} | ours protocol=release {ours}")
    assert ours == pytest.approx(expected, rel=1e-6, abs=1e-9)
    assert module.missing_score == 0.5  # the release's reward when the RM gives none
