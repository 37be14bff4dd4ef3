"""PPO on tiny random models on the CPU: the reward adapter TRL calls, a short real PPO run
against a tiny scalar RM, answers from the trained policy, and refusals of bad inputs."""

import json
import math

import pytest
import torch

from prblib.rewards.base import ModelSpec, ScoreInput
from prblib.errors import ModelError
from prblib.downstream.ppo import TextRewardModule, generate_answers, policy_prompts, scalar_scorer, train_ppo
from prblib.rewards.scalar import ScalarRewardModel
from tests.prblib.test_llm import save_tiny_causal_lm
from prblib.tiny_models import build_decoder_rm

ITEMS = [
    {"id": "q1", "question": "What should I read next?", "profile": ["I loved Dune.", "Long books bore me."]},
    {"id": "q2", "question": "How do I meet people who like board games?", "profile": [{"text": "I just moved."}]},
    {"id": "q3", "question": "Tea or coffee in the morning?", "profile": []},
]


@pytest.fixture(scope="module")
def policy_folder(tmp_path_factory):
    return save_tiny_causal_lm(tmp_path_factory.mktemp("ppo-policy"))


@pytest.fixture(scope="module")
def policy_tokenizer(policy_folder):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(policy_folder, local_files_only=True)


@pytest.fixture(scope="module")
def scalar_rm(tmp_path_factory):
    folder = build_decoder_rm(tmp_path_factory.mktemp("ppo-rm"))
    rm = ScalarRewardModel.load(ModelSpec(kind="scalar", path=str(folder)))
    yield rm
    rm.close()


def trl_rows(tokenizer, prompts, responses):
    """query_response rows laid out as TRL's PPO builds them: prompts left-padded to one length,
    responses right-padded; also the unpadded ids of each part."""
    pad = tokenizer.pad_token_id
    prompt_ids = [tokenizer(p)["input_ids"] for p in prompts]
    response_ids = [tokenizer(r, add_special_tokens=False)["input_ids"] for r in responses]
    context = max(map(len, prompt_ids))
    width = max(map(len, response_ids)) + 2
    rows = [[pad] * (context - len(p)) + p + r + [pad] * (width - len(r)) for p, r in zip(prompt_ids, response_ids)]
    return torch.tensor(rows), context, prompt_ids, response_ids


def trl_get_reward(module, rows, tokenizer, context):
    from trl.experimental.utils import get_reward

    return get_reward(module, rows, tokenizer.pad_token_id, context)


# -- the reward adapter ------------------------------------------------------------------------

def test_trl_reads_the_wrapped_scalar_rms_score_of_the_decoded_prompt_and_response(policy_tokenizer, scalar_rm):
    tok = policy_tokenizer
    prompts = ["What should I read next?", "I moved to a new city. How do I meet people who like board games?"]
    responses = ["A short novel you can finish in a week.", "Try a weekly game night."]
    rows, context, prompt_ids, response_ids = trl_rows(tok, prompts, responses)
    module = TextRewardModule(scalar_scorer(scalar_rm)).bind(tok, context_length=context)

    logits, scores, _ = trl_get_reward(module, rows, tok, context)

    assert logits.shape == (2, rows.shape[1], 1)
    for row in range(2):
        prompt_text = tok.decode(prompt_ids[row], skip_special_tokens=True).strip()
        response_text = tok.decode(response_ids[row], skip_special_tokens=True).strip()
        [(_, [expected])] = scalar_rm.score_groups(
            [ScoreInput(id="x", question=prompt_text, responses=(response_text,))], setting="no_profile")
        assert scores[row].item() == pytest.approx(expected, abs=1e-5)
    assert scores[0].item() != pytest.approx(scores[1].item(), abs=1e-6)


def test_the_scorer_gets_bound_prompt_keys_and_the_response_up_to_the_first_pad(policy_tokenizer):
    tok = policy_tokenizer
    seen = []

    def score_texts(pairs):
        seen.extend(pairs)
        return [float(len(response)) for _, response in pairs]

    rows, context, prompt_ids, _ = trl_rows(tok, ["first question?", "a much longer second question here?"],
                                            ["good answer", "other answer words"])
    rows[1, context + 1] = tok.pad_token_id  # a pad the policy generated: TRL ends the response there
    keys = {tuple(prompt_ids[0]): "q1", tuple(prompt_ids[1]): "q2"}
    module = TextRewardModule(score_texts).bind(tok, context_length=context, prompt_keys=keys)

    _, scores, _ = trl_get_reward(module, rows, tok, context)

    assert seen == [("q1", "good answer"), ("q2", "other")]
    assert scores.tolist() == [len("good answer"), len("other")]
    unknown, _, _, _ = trl_rows(tok, ["a prompt it was not bound with"], ["x"])
    with pytest.raises(ModelError, match="not one the reward module was bound with"):
        module(unknown[:, :context + 1])


def test_the_reward_module_refuses_unusable_scores_and_can_substitute_missing_ones(policy_tokenizer):
    tok = policy_tokenizer
    rows, context, _, _ = trl_rows(tok, ["one?", "two?"], ["a", "b"])

    def bound(fn, **kwargs):
        return TextRewardModule(fn, **kwargs).bind(tok, context_length=context)

    with pytest.raises(ModelError, match="returned 1 scores for 2"):
        bound(lambda pairs: [1.0])(rows)
    with pytest.raises(ModelError, match="gave no score"):
        bound(lambda pairs: [None, 1.0])(rows)
    with pytest.raises(ModelError, match="not a finite number"):
        bound(lambda pairs: [math.nan, 1.0])(rows)
    with pytest.raises(ModelError, match="not bound"):
        TextRewardModule(lambda pairs: [0.0, 0.0])(rows)
    with pytest.raises(ModelError, match="callable"):
        TextRewardModule("not a scorer")
    assert bound(lambda pairs: [None, 1.0], missing_score=-3.0)(rows).tolist() == [-3.0, 1.0]


# -- a real PPO run ----------------------------------------------------------------------------

def test_a_short_ppo_run_trains_saves_safetensors_and_the_policy_answers(policy_folder, scalar_rm, tmp_path):
    from safetensors.torch import load_file

    prepared = policy_prompts(ITEMS)
    seen_prompts, steps_done = [], []
    inner = scalar_scorer(scalar_rm, setting="profile", contexts=prepared.contexts)

    def score_texts(pairs):
        seen_prompts.extend(prompt for prompt, _ in pairs)
        return inner(pairs)

    out = tmp_path / "trained"
    result = train_ppo(policy_path=policy_folder, reward=score_texts, prompts=prepared.prompts,
                       reward_prompts=prepared.reward_prompts, out_dir=out, steps=2, batch_size=2,
                       learning_rate=1e-4, response_length=8, ppo_epochs=1, seed=0, progress=steps_done.append)

    assert result.algorithm == "ppo" and result.steps == 2 and result.out_dir == str(out.resolve())
    assert [s["step"] for s in result.stats] == [1, 2]
    assert all(math.isfinite(s["mean_score"]) for s in result.stats)
    assert steps_done == [1, 1] and result.seconds > 0
    assert len(seen_prompts) == 4 and set(seen_prompts) <= {"q1", "q2", "q3"}  # the RM got item ids -> contexts

    assert (out / "model.safetensors").is_file()
    assert not list(out.glob("*.bin")) and not list(out.glob("*.pt"))
    before, after = load_file(policy_folder / "model.safetensors"), load_file(out / "model.safetensors")
    assert before.keys() == after.keys()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    info = json.loads((out / "ppo_run.json").read_text())
    assert info["algorithm"] == "ppo" and info["stats"] == result.stats

    answers = generate_answers(out, prepared.prompts[:2] + ["A plain text prompt?"], max_new_tokens=6, seed=0)
    assert len(answers) == 3 and all(isinstance(a.text, str) for a in answers)
    assert generate_answers(out, ["A plain text prompt?"], max_new_tokens=6, seed=0) == answers[2:]


def test_a_ppo_run_is_reproducible_from_its_seed(policy_folder, tmp_path):
    from safetensors.torch import load_file

    def run(name, seed):
        train_ppo(policy_path=policy_folder, reward=lambda pairs: [len(r) / 10 for _, r in pairs],
                  prompts=["a?", "b c?", "d e f?"], out_dir=tmp_path / name, steps=1, batch_size=2,
                  response_length=4, ppo_epochs=1, learning_rate=1e-3, seed=seed)
        return load_file(tmp_path / name / "model.safetensors")

    first, again, other = run("a", 0), run("b", 0), run("c", 1)
    assert all(torch.equal(first[k], again[k]) for k in first)
    assert any(not torch.equal(first[k], other[k]) for k in first)


@pytest.mark.parametrize("knob", [{"learning_rate": 1e-2}, {"kl_coef": 1.0}, {"vf_coef": 1.0},
                                  {"cliprange": 0.01, "ppo_epochs": 3},
                                  # the release's own critic rate and decay (a second AdamW group), verl's constant rate
                                  {"critic_learning_rate": 1e-1, "weight_decay": 0.01}, {"lr_schedule": "constant"}])
def test_each_ppo_knob_reaches_training(policy_folder, tmp_path, knob):
    """Same seed, one knob changed from its default: the trained weights differ, and
    ppo_run.json records the value PPOConfig got."""
    from safetensors.torch import load_file

    def run(name, **change):
        train_ppo(policy_path=policy_folder, reward=lambda pairs: [len(r) / 10 for _, r in pairs],
                  prompts=["a?", "b c?", "d e f?"], out_dir=tmp_path / name, steps=2, batch_size=2,
                  response_length=4, seed=0, **{"learning_rate": 1e-3, "ppo_epochs": 3, **change})
        return load_file(tmp_path / name / "model.safetensors"), json.loads((tmp_path / name / "ppo_run.json")
                                                                             .read_text())["settings"]

    (base, _), (changed, recorded) = run("base"), run("changed", **knob)
    assert any(not torch.equal(base[k], changed[k]) for k in base)
    assert all(recorded[k] == v for k, v in knob.items())


# -- refusals ----------------------------------------------------------------------------------

def zeros(pairs):
    return [0.0] * len(pairs)


@pytest.mark.parametrize(("change", "message"), [
    ({"prompts": []}, "no prompts"),
    ({"prompts": "one text"}, "list of prompts"),
    ({"prompts": ["ok?", [{"role": "user", "content": "  "}]]}, "end with a non-empty user message"),
    ({"prompts": ["ok?", [{"role": "robot", "content": "hi"}]]}, "role"),
    ({"batch_size": 3}, "larger than the 2 prompts"),
    ({"steps": 0}, "steps must be"),
    ({"response_length": 2.5}, "response_length must be"),
    ({"learning_rate": 0}, "learning_rate must be"),
    ({"batch_size": 2, "mini_batches": 3}, "multiple of mini_batches"),
    ({"whiten_rewards": True}, "whiten_rewards needs mini-batches of at least 8"),
    ({"reward_prompts": ["only one"]}, "1 reward prompts for 2 prompts"),
    ({"reward": 42}, "TextRewardModule or a callable"),
    ({"policy_path": "/nonexistent/policy"}, "does not exist"),
    ({"device": "tpu"}, "unknown device"),
    ({"response_length": 5000}, "exceeds the policy's context"),
    ({"reward": lambda pairs: [None] * len(pairs)}, "gave no score"),
])
def test_bad_ppo_inputs_are_refused_with_a_clear_model_error(policy_folder, tmp_path, change, message):
    kwargs = {"policy_path": policy_folder, "reward": zeros, "prompts": ["What should I read?", "Tea or coffee?"],
              "out_dir": tmp_path / "out", "steps": 1, "batch_size": 2, "response_length": 4, "ppo_epochs": 1,
              **change}
    with pytest.raises(ModelError, match=message):
        train_ppo(**kwargs)


def test_ppo_never_writes_over_a_model_or_decodes_with_another_tokenizer(policy_folder, policy_tokenizer, tmp_path):
    prompts = ["What should I read?", "Tea or coffee?"]
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "model.safetensors").write_bytes(b"")
    with pytest.raises(ModelError, match="not empty"):
        train_ppo(policy_path=policy_folder, reward=zeros, prompts=prompts, out_dir=taken, steps=1, batch_size=2)
    with pytest.raises(ModelError, match="overwrite the policy"):
        train_ppo(policy_path=policy_folder, reward=zeros, prompts=prompts, out_dir=policy_folder, steps=1,
                  batch_size=2)
    other = type(policy_tokenizer).from_pretrained(policy_folder, local_files_only=True)
    other.add_tokens(["<not-in-the-policy>"])
    with pytest.raises(ModelError, match="different tokenizer"):
        train_ppo(policy_path=policy_folder, reward=TextRewardModule(zeros, other), prompts=prompts,
                  out_dir=tmp_path / "out", steps=1, batch_size=2, response_length=4)


def test_an_answer_cut_at_the_token_cap_is_retried_once_with_twice_the_budget_then_marked(tmp_path):
    # A random model never samples an end-of-sequence id: every answer stops at the cap.
    never_ends = save_tiny_causal_lm(tmp_path / "rambling")
    [cut] = generate_answers(never_ends, ["What should I read next?"], max_new_tokens=4, seed=0)
    assert cut.truncated and cut.retried and cut.text  # kept (graded and counted by the caller), not dropped
    from prblib.llm.client import LocalCausalLMBackend

    backend = LocalCausalLMBackend(never_ends)
    [eight] = backend.complete([{"role": "user", "content": "What should I read next?"}], temperature=0.0,
                               max_tokens=8, seed=0)
    backend.close()
    assert eight.truncated and cut.text == eight.text  # the text of the retry with 2 x 4 tokens

    # Every third token id ends a sequence: answers stop at an end token, within the first budget.
    ends = save_tiny_causal_lm(tmp_path / "brief", end_every=3)
    answers = generate_answers(ends, ["What should I read next?", "Tea or coffee?"], max_new_tokens=64, seed=0)
    assert [(a.truncated, a.retried) for a in answers] == [(False, False), (False, False)]


def test_generate_answers_refuses_bad_inputs(policy_folder):
    with pytest.raises(ModelError, match="no prompts"):
        generate_answers(policy_folder, [], max_new_tokens=4, seed=0)
    with pytest.raises(ModelError, match="max_new_tokens"):
        generate_answers(policy_folder, ["hi?"], max_new_tokens=0, seed=0)
    with pytest.raises(ModelError, match="does not exist"):
        generate_answers("/nonexistent/policy", ["hi?"], max_new_tokens=4, seed=0)
