"""The scalar reward model: what it is shown, and that its fast engine scores like a plain forward pass."""

from __future__ import annotations

import re
import dataclasses
import random

import pytest
import torch

from prblib.rewards.base import ModelSpec, PairInput, ScoreInput, load_reward_model
from prblib.errors import ModelError
from prblib.rewards.scalar import PLAIN_FORMAT, ScalarRewardModel, positive_label_index
from prblib.tiny_models import build_decoder_rm, build_encoder_rm

TOLERANCE = 1e-4
WORDS = ("garden tomato ferry violin pottery marathon lantern harbor mosaic canyon pepper quartz "
         "glacier walnut orchid saddle meadow compass biscuit falcon").split()


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return {
        # Llama layout, chat template that writes BOS itself, has a pad token
        "llama": build_decoder_rm(root / "llama"),
        # Qwen2 layout, no chat template, no pad token at all
        "qwen": build_decoder_rm(root / "qwen", arch="qwen2", chat_template=None, pad=False, seed=1),
        "bert": build_encoder_rm(root / "bert"),
        "bert2": build_encoder_rm(root / "bert2", num_labels=2, seed=2),
        "bert2_named": build_encoder_rm(root / "bert2_named", num_labels=2, seed=3,
                                        id2label={0: "chosen", 1: "rejected"}),
        "bert3": build_encoder_rm(root / "bert3", num_labels=3),
    }


def load(folder, **spec):
    return ScalarRewardModel.load(ModelSpec(kind="scalar", path=str(folder), **spec))


@pytest.fixture(scope="module")
def llama(folders):
    return load(folders["llama"])


@pytest.fixture(scope="module")
def qwen(folders):
    return load(folders["qwen"])


@pytest.fixture(scope="module")
def references(folders):
    """transformers' own models, loaded independently, for plain one-sequence forward passes."""
    from transformers import AutoModelForSequenceClassification

    return {name: AutoModelForSequenceClassification.from_pretrained(
        folder, local_files_only=True, use_safetensors=True).eval() for name, folder in folders.items()
        if name != "bert3"}


def reference_score(reference, rm: ScalarRewardModel, text: str) -> float:
    ids = rm.tokenizer(text, add_special_tokens=rm.add_special_tokens)["input_ids"]
    with torch.no_grad():
        logits = reference(torch.tensor([ids])).logits[0]
    if logits.shape[0] == 2:
        pos = positive_label_index(reference.config.id2label)
        return float(logits[pos] - logits[1 - pos])
    return float(logits[0])


def sentence(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n)) + "."


def make_pairs(n: int, seed: int = 0, posts: int = 3) -> list[PairInput]:
    rng = random.Random(seed)
    return [PairInput(id=f"p{i}", domain="Arts", question=f"Question {i}: " + sentence(rng, rng.randint(3, 12)),
                      chosen=sentence(rng, rng.randint(1, 30)), rejected=sentence(rng, rng.randint(1, 30)),
                      profile=tuple(sentence(rng, rng.randint(4, 15)) for _ in range(rng.randint(0, posts))))
            for i in range(n)]


def make_groups(n: int, size: int = 16, seed: int = 0) -> list[ScoreInput]:
    rng = random.Random(seed)
    return [ScoreInput(id=f"g{i}", question=sentence(rng, rng.randint(3, 12)),
                       responses=tuple(sentence(rng, rng.randint(1, 40)) for _ in range(size)),
                       profile=tuple(sentence(rng, 8) for _ in range(3))) for i in range(n)]


# --- what the model is shown -------------------------------------------------------------

PAIR = PairInput(id="x1", domain="Lifestyle", question="How can I keep my sourdough starter alive while travelling?",
                 chosen="Feed it, then refrigerate it.", rejected="Buy bread instead.",
                 profile=("I bake bread every weekend.", "I travel for work twice a month.", "I hate waste."),
                 plan=("Practical steps for a frequent traveller", "Avoids wasting food"))


def test_the_profile_setting_shows_the_question_and_every_profile_post(llama):
    chosen, rejected = llama.render_inputs(PAIR, setting="profile")
    for text in (chosen, rejected):
        assert PAIR.question in text
        assert all(post in text for post in PAIR.profile)
        assert not any(aspect in text for aspect in PAIR.plan)
    assert chosen.index("I bake bread") < chosen.index("I travel for work") < chosen.index("I hate waste")


def test_the_no_profile_setting_shows_the_question_without_the_profile(llama):
    chosen, _ = llama.render_inputs(PAIR, setting="no_profile")
    assert PAIR.question in chosen and PAIR.chosen in chosen
    assert not any(post in chosen for post in PAIR.profile)


def test_the_plan_setting_shows_the_planner_aspects_and_not_the_profile(llama):
    chosen, _ = llama.render_inputs(PAIR, setting="plan")
    assert all(aspect in chosen for aspect in PAIR.plan) and PAIR.question in chosen
    assert not any(post in chosen for post in PAIR.profile)


def test_the_plan_setting_is_refused_for_a_pair_without_aspects(llama):
    bare = dataclasses.replace(PAIR, plan=())
    with pytest.raises(ModelError, match="planner aspects"):
        llama.render_inputs(bare, setting="plan")
    with pytest.raises(ModelError, match="planner aspects"):
        list(llama.score_pairs([PAIR, bare], setting="plan"))


def test_a_pair_has_no_place_for_the_narrative_or_the_rubric(llama):
    names = {f.name for f in dataclasses.fields(PairInput)} | {f.name for f in dataclasses.fields(ScoreInput)}
    assert not any("narrative" in n or "rubric" in n for n in names)
    chosen, _ = llama.render_inputs(PAIR, setting="profile")
    leftover = chosen
    for part in (PAIR.question, PAIR.chosen, *PAIR.profile):
        leftover = leftover.replace(part, "")
    assert len(leftover) < 150  # only the template and the context's headings remain


def test_a_chat_template_renders_the_context_as_user_turn_and_the_response_as_assistant_turn(llama):
    from prblib.context import render_context

    chosen, rejected = llama.render_inputs(PAIR, setting="profile")
    context = render_context(PAIR.question, setting="profile", profile=PAIR.profile)
    expected = llama.tokenizer.apply_chat_template(
        [{"role": "user", "content": context}, {"role": "assistant", "content": PAIR.rejected}], tokenize=False)
    assert rejected == expected and llama.uses_chat_template


def test_without_a_chat_template_the_plain_format_is_used(qwen):
    chosen, _ = qwen.render_inputs(PAIR, setting="no_profile")
    assert not qwen.uses_chat_template
    assert chosen == PLAIN_FORMAT.format(context=PAIR.question, response=PAIR.chosen)


def capture_units(rm, monkeypatch):
    seen = []
    original = rm.engine.score

    def spy(units):
        seen.extend(units)
        return original(units)

    monkeypatch.setattr(rm.engine, "score", spy)
    return seen


def test_a_template_that_writes_bos_itself_gives_exactly_one_bos_token(llama, monkeypatch):
    seen = capture_units(llama, monkeypatch)
    list(llama.score_pairs([PAIR], setting="profile"))
    bos = llama.tokenizer.bos_token_id
    assert llama.render_inputs(PAIR, setting="profile")[0].startswith(llama.tokenizer.bos_token)
    for ids in seen[0].sequences:
        assert ids[0] == bos and ids.count(bos) == 1


def test_the_plain_format_gets_the_tokenizers_own_special_tokens_once(qwen, monkeypatch):
    seen = capture_units(qwen, monkeypatch)
    list(qwen.score_pairs([PAIR], setting="profile"))
    tok = qwen.tokenizer
    for ids in seen[0].sequences:
        assert ids[0] == tok.cls_token_id and ids.count(tok.cls_token_id) == 1
        assert ids[-1] == tok.sep_token_id and ids.count(tok.sep_token_id) == 1


def test_a_tokenizer_without_a_pad_token_gets_one_on_the_tokenizer_and_the_model(qwen):
    assert qwen.tokenizer.pad_token == "[SEP]"
    assert qwen.model.config.pad_token_id == qwen.tokenizer.sep_token_id
    assert qwen.skip_id is None  # the score stays at the last token, as shipped


# --- scores ------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["llama", "qwen", "bert", "bert2"])
def test_a_sequence_scores_the_same_alone_and_inside_a_padded_batch(folders, references, name):
    pairs = make_pairs(9, seed=5)
    alone = {r.id: r for r in load(folders[name], batch_size=1).score_pairs(pairs, setting="profile")}
    rm = load(folders[name], batch_size=8)
    batched = {r.id: r for r in rm.score_pairs(pairs, setting="profile")}
    for pair in pairs:
        assert batched[pair.id].chosen_score == pytest.approx(alone[pair.id].chosen_score, abs=TOLERANCE)
        assert batched[pair.id].rejected_score == pytest.approx(alone[pair.id].rejected_score, abs=TOLERANCE)
    first = pairs[0]
    text = rm.render_inputs(first, setting="profile")[0]
    assert batched[first.id].chosen_score == pytest.approx(reference_score(references[name], rm, text), abs=TOLERANCE)


@pytest.mark.parametrize("name", ["llama", "qwen"])
@pytest.mark.parametrize("batch_size", [1, 3])
def test_the_prefix_cache_scores_pairs_like_a_full_forward_pass(folders, references, name, batch_size):
    rm = load(folders[name], batch_size=batch_size)
    assert rm.engine.mode == "prefix"
    pairs = make_pairs(7, seed=batch_size)
    results = {r.id: r for r in rm.score_pairs(pairs, setting="profile")}
    assert set(results) == {p.id for p in pairs}
    for pair in pairs:
        chosen, rejected = rm.render_inputs(pair, setting="profile")
        assert results[pair.id].chosen_score == pytest.approx(
            reference_score(references[name], rm, chosen), abs=TOLERANCE)
        assert results[pair.id].rejected_score == pytest.approx(
            reference_score(references[name], rm, rejected), abs=TOLERANCE)


@pytest.mark.parametrize("name", ["llama", "qwen"])
@pytest.mark.parametrize("batch_size", [1, 3])
def test_the_prefix_cache_scores_groups_of_16_like_a_full_forward_pass(folders, references, name, batch_size):
    from prblib.context import render_context

    rm = load(folders[name], batch_size=batch_size)
    groups = make_groups(3, seed=batch_size)
    results = dict(rm.score_groups(groups, setting="profile"))
    assert set(results) == {g.id for g in groups}
    for group in groups:
        context = render_context(group.question, setting="profile", profile=group.profile)
        expected = [reference_score(references[name], rm, rm._render(context, r)) for r in group.responses]
        assert results[group.id] == pytest.approx(expected, abs=TOLERANCE)


def test_identical_responses_tie_under_the_prefix_cache(llama, references):
    same = dataclasses.replace(PAIR, rejected=PAIR.chosen)
    [result] = llama.score_pairs([same], setting="profile")
    assert result.tie and not result.correct
    text = llama.render_inputs(same, setting="profile")[0]
    assert result.chosen_score == pytest.approx(reference_score(references["llama"], llama, text), abs=TOLERANCE)


def test_turning_the_prefix_cache_off_gives_the_same_scores(folders, llama):
    plain = load(folders["llama"], options={"prefix_cache": False})
    assert plain.engine.mode == "full"
    pairs = make_pairs(5, seed=9)
    fast = {r.id: r.chosen_score for r in llama.score_pairs(pairs, setting="profile")}
    slow = {r.id: r.chosen_score for r in plain.score_pairs(pairs, setting="profile")}
    assert all(fast[k] == pytest.approx(slow[k], abs=TOLERANCE) for k in fast)


def test_an_encoder_with_one_label_scores_with_that_logit(folders, references):
    rm = load(folders["bert"])
    assert rm.engine.mode == "logits"
    [result] = rm.score_pairs([PAIR], setting="profile")
    text = rm.render_inputs(PAIR, setting="profile")[1]
    assert result.rejected_score == pytest.approx(reference_score(references["bert"], rm, text), abs=TOLERANCE)


def test_an_encoder_with_two_labels_scores_the_log_odds_of_the_positive_class(folders, references):
    for name, positive in (("bert2", 1), ("bert2_named", 0)):
        rm = load(folders[name])
        [result] = rm.score_pairs([PAIR], setting="no_profile")
        ids = rm.tokenizer(rm.render_inputs(PAIR, setting="no_profile")[0])["input_ids"]
        with torch.no_grad():
            logits = references[name](torch.tensor([ids])).logits[0]
        assert result.chosen_score == pytest.approx(float(logits[positive] - logits[1 - positive]), abs=TOLERANCE)


def test_the_positive_class_is_found_by_its_name_else_index_1():
    assert positive_label_index({0: "LABEL_0", 1: "LABEL_1"}) == 1
    assert positive_label_index({"0": "chosen", "1": "rejected"}) == 0
    assert positive_label_index({0: "POSITIVE", 1: "NEGATIVE"}) == 0
    assert positive_label_index({0: "bad", 1: "good"}) == 1
    assert positive_label_index({0: "cat", 1: "dog"}) == 1


def test_a_head_with_more_than_two_labels_is_refused(folders):
    with pytest.raises(ModelError, match=re.escape("config.json has 3 labels; a scalar reward model needs 1 (the score) or 2")):
        load(folders["bert3"])


# --- length ------------------------------------------------------------------------------

def long_profile_pair() -> PairInput:
    posts = tuple(f"Post number {i}: " + " ".join([WORDS[i]] * 12) for i in range(8))
    return PairInput(id="long-1", domain="Society", question="Which hobby suits me best?",
                     chosen="Try " + " ".join(WORDS[:20]) + " and see what sticks.", rejected="Knitting.",
                     profile=posts)


def test_a_long_context_drops_the_lowest_ranked_posts_first_and_reports_how_many(folders):
    pair = long_profile_pair()
    roomy = load(folders["llama"])
    full_length = max(len(roomy.tokenizer(t, add_special_tokens=False)["input_ids"])
                      for t in roomy.render_inputs(pair, setting="profile"))
    rm = load(folders["llama"], max_length=full_length - 40)  # ~3 posts too long
    chosen, rejected = rm.render_inputs(pair, setting="profile")
    [result] = rm.score_pairs([pair], setting="profile")
    dropped = result.details["truncated_posts"]
    assert 1 <= dropped < len(pair.profile)
    kept = len(pair.profile) - dropped
    for text in (chosen, rejected):
        assert all(post in text for post in pair.profile[:kept])
        assert not any(post in text for post in pair.profile[kept:])
        assert pair.question in text
    assert pair.chosen in chosen and pair.rejected in rejected  # never cut
    assert max(result.details["tokens"]) <= rm.max_length
    # dropping one post fewer would not have fitted
    from prblib.context import render_context
    context = render_context(pair.question, setting="profile", profile=pair.profile, keep_posts=kept + 1)
    assert len(rm._tokenize(rm._render(context, pair.chosen))) > rm.max_length


def test_a_pair_that_fits_reports_no_truncated_posts(llama):
    [result] = llama.score_pairs([PAIR], setting="profile")
    assert result.details["truncated_posts"] == 0


def test_the_response_is_never_cut_a_pair_too_long_without_posts_is_refused(folders):
    rm = load(folders["llama"], max_length=64)
    pair = dataclasses.replace(PAIR, id="huge-7", chosen=" ".join(WORDS * 5))
    with pytest.raises(ModelError, match="huge-7.*never cut"):
        list(rm.score_pairs([PAIR, pair], setting="profile"))


def test_the_length_limit_is_the_smaller_of_the_spec_and_the_model(folders):
    assert load(folders["bert"], max_length=100_000).max_length == 512
    assert load(folders["bert"], max_length=300).max_length == 300


# --- runtime -----------------------------------------------------------------------------

def test_results_come_back_for_every_pair_with_progress_counted(llama):
    pairs = make_pairs(10, seed=3)
    ticks = []
    results = list(llama.score_pairs(pairs, setting="profile", progress=ticks.append))
    assert sorted(r.id for r in results) == sorted(p.id for p in pairs)
    assert sum(ticks) == len(pairs)


def test_scoring_leaves_the_callers_autograd_state_alone(llama):
    results = llama.score_pairs(make_pairs(4), setting="profile")
    next(results)
    assert torch.is_grad_enabled() and not torch.is_inference_mode_enabled()
    list(results)


def test_the_registry_loads_a_scalar_model(folders):
    rm = load_reward_model(ModelSpec(kind="scalar", path=str(folders["bert"])))
    assert isinstance(rm, ScalarRewardModel) and rm.kind == "scalar"
    rm.close()
    assert rm.model is None


def test_asking_for_cuda_without_cuda_fails_clearly(folders, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ModelError, match="CUDA is not available"):
        load(folders["bert"], device="cuda")


def test_an_unknown_dtype_or_device_is_refused(folders):
    with pytest.raises(ModelError, match="unknown dtype"):
        load(folders["bert"], dtype="int3")
    with pytest.raises(ModelError, match="unknown device"):
        load(folders["bert"], device="tpu")


def test_an_explicit_bfloat16_dtype_is_honoured(folders):
    rm = load(folders["llama"], dtype="bfloat16")
    assert next(rm.model.parameters()).dtype == torch.bfloat16
    [result] = rm.score_pairs([PAIR], setting="profile")
    assert isinstance(result.chosen_score, float)


def test_a_model_whose_cache_cannot_be_shared_falls_back_to_full_scoring(folders, references, monkeypatch):
    from prblib.rewards import engine

    def refuse(self, batch):
        raise engine.PrefixCacheUnavailable("sliding-window layers")

    monkeypatch.setattr(engine.ScoringEngine, "_prefix_batch", refuse)
    rm = load(folders["llama"], batch_size=3)
    assert rm.engine.mode == "full"
    [result] = rm.score_pairs([PAIR], setting="profile")
    text = rm.render_inputs(PAIR, setting="profile")[0]
    assert result.chosen_score == pytest.approx(reference_score(references["llama"], rm, text), abs=TOLERANCE)


def test_a_prefix_cache_that_changes_scores_is_turned_off_at_load(folders, monkeypatch):
    from prblib.rewards import engine

    real = engine.ScoringEngine._prefix_batch

    def skewed(self, batch):
        return [(key, [s + 1.0 for s in scores]) for key, scores in real(self, batch)]

    monkeypatch.setattr(engine.ScoringEngine, "_prefix_batch", skewed)
    assert load(folders["llama"]).engine.mode == "full"


def test_a_template_without_bos_gets_the_tokenizers_special_tokens_once(tmp_path, monkeypatch):
    template = "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}\n{% endfor %}"
    rm = load(build_decoder_rm(tmp_path / "no-bos", chat_template=template))
    assert rm.uses_chat_template and rm.add_special_tokens
    seen = capture_units(rm, monkeypatch)
    list(rm.score_pairs([PAIR], setting="no_profile"))
    for ids in seen[0].sequences:
        assert ids[0] == rm.tokenizer.bos_token_id and ids.count(rm.tokenizer.bos_token_id) == 1


def test_no_pairs_give_no_results(llama):
    assert list(llama.score_pairs([], setting="profile")) == []
    assert list(llama.score_groups([], setting="profile")) == []
