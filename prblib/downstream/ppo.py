"""PPO: train a policy against a reward model with TRL's PPO, then let it answer for judging.

The downstream experiment of the Personalized RewardBench paper: a policy (Qwen2.5-0.5B-Instruct) is trained with PPO
against one reward model, answers the test questions, and its answers are judged on the
personal rubric like Best-of-N picks. Whether RMs that rank higher on the benchmark also make
better PPO policies is what this checks. This module does PPO only (no GRPO, RLOO, ...).

Pieces.
- `TextRewardModule`: makes any text scorer look like the reward model TRL's PPO expects.
- `scalar_scorer`: a text scorer from a `ScalarRewardModel` (one-response groups).
- `policy_prompts`: the policy's prompts for benchmark items, with the keys and contexts the
  reward side needs, so the policy and the RM each see what they should.
- `train_ppo`: one PPO run; saves the trained policy (safetensors) and returns a `PPOResult`.
- `generate_answers`: answers of a (trained) policy folder, greedy or seeded.

How TRL 1.12's PPO uses a reward model (trl/experimental/utils.py, get_reward), and so what
`TextRewardModule` provides:
    backbone = getattr(model, model.base_model_prefix)
    out = backbone(input_ids=ids_with_pads_set_to_0, attention_mask=ids != pad, position_ids=...,
                   return_dict=True, output_hidden_states=True, use_cache=False)
    logits = model.score(out.hidden_states[-1])                       # (batch, length, 1)
    score = logits[row, context_length - 1 + first pad in the response region (or its end)]
The reward model is given the POLICY's token ids (prompt, then response) and the policy's pad
id; nothing else. A transformers RM therefore only works directly when it shares the policy's
tokenizer, and it would see the policy's chat template, not its own. `TextRewardModule`
instead decodes the ids with the policy tokenizer, hands (prompt, response) texts to a
`score_texts` callable (which re-renders and re-tokenizes them its own way: a scalar RM with
its own tokenizer and template, a generative judge, P-GenRM...), and returns a
(batch, length, 1) tensor holding each row's score at every position, so whichever index TRL
reads gives that score. Its `score` is the identity. The response is cut where TRL cuts it:
at the first pad id after the prompt (TRL fills everything after the stop token with pads).
It is decoded without special tokens and stripped, as `LocalCausalLMBackend` (and so
`generate_answers` and Best-of-N sampling) decodes answers.

Which prompt text the scorer gets. TRL passes no prompt index, only token ids, so the module
needs the prompt/response boundary: `train_ppo` left-pads every prompt to one common length
(the longest prompt) in the dataset itself, so each batch's context length is that length,
and binds it with a map from each prompt's token ids to its reward prompt string (by default
the last user message; with `policy_prompts`, the item id, which `scalar_scorer` turns back
into the item's question and profile for the RM's setting). Unbound use decodes the prompt.

What TRL 1.12's PPO needs that is not obvious, and how it is handled here.
- A pad token that never occurs in real text: every token equal to the pad id is treated as
  padding (masked out of attention, and the response is cut at the first one). A tokenizer
  without a pad token gets its unk token (else its eos token, with a warning: with pad = eos
  the EOS token is masked out of the loss, so the policy hardly learns to stop). Prompts that
  contain the pad id are refused.
- An eos token on the tokenizer: TRL compares responses with `eos_token_id` for its metrics,
  and with None that comparison crashes. A policy tokenizer without one gets its pad token as
  eos for TRL's copy only; it is then not used as a stop token. With an eos token, generation
  stops there (stop_token="eos") and the rest of the response is padding.
- Left padding: TRL's generation assumes left-padded prompts but does not check; the dataset
  is pre-padded on the left here whatever the tokenizer's padding side.
- A batch larger than the dataset: TRL's dataloader drops the ragged last batch and loops
  forever over an empty one; refused here.
- TRL overwrites the policy's generation_config.eos_token_id with the stop token; the original
  generation config is restored before the trained policy is saved.
- Precision: PPOTrainer builds its own Accelerator without the config's mixed precision, so
  bf16/fp16 flags do not apply; models are loaded in `dtype` (float32 by default) and train in
  it. Activation (gradient) checkpointing, on by default in TRL's configs, is switched off: PPOTrainer
  never enables it anyway.
- TRL's PPO also needs the ref policy as a separate object (a frozen copy is loaded here), the
  value model as a sequence-classification model whose backbone sits at `base_model_prefix`
  (here AutoModelForSequenceClassification from the policy's weights, num_labels=1, with a
  fresh score head), and `input_ids` rows in a datasets.Dataset.

Nothing is downloaded or run from a model folder: folders pass modelcheck (no remote code,
safetensors only), loading uses local_files_only and trust_remote_code=False, and the trained
policy is written as safetensors. No Django here; trl is imported only inside `train_ppo`.
"""

from __future__ import annotations

import copy
import json
import logging
import math
import os
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# TRL prints a warning on importing trl.experimental unless this is set; it must be set before
# that import (done lazily in train_ppo).
os.environ["TRL_EXPERIMENTAL_SILENCE"] = "1"

import torch  # noqa: E402

from prblib.rewards.base import ScoreInput
from prblib.registry import DEFAULT_PROFILE_K
from prblib.errors import ModelError  # noqa: E402
from prblib.llm.client import Messages, messages_as_text  # noqa: E402

log = logging.getLogger(__name__)

ALGORITHM = "ppo"
ROLES = ("system", "user", "assistant")
RUN_INFO_FILE = "ppo_run.json"
DEFAULT_THREADS = 4  # CPU threads while training (torch's default takes every core)

ScoreTexts = Callable[[list[tuple[str, str]]], Sequence[float | None]]
Prompt = str | Sequence[Mapping[str, str]]


# --------------------------------------------------------------------------------------------
# The reward model TRL sees


@dataclass
class _BackboneOutput:
    hidden_states: tuple[torch.Tensor, ...]


class TextRewardModule(torch.nn.Module):
    """Any text scorer, shaped as the reward model TRL's PPO calls (see the module docstring).

    `score_texts` takes a list of (prompt, response) strings and returns one float per pair
    (None for "no usable score", which raises ModelError unless `missing_score` is given).
    `tokenizer` is the POLICY's tokenizer (train_ppo sets it when None). `context_length` is
    where the prompt region of TRL's query_response rows ends; `prompt_keys` maps a prompt's
    token ids (without padding) to the string the scorer receives for it. Both are set by
    `bind` (train_ppo does it); without keys the prompt is decoded like the response.
    """

    base_model_prefix = "backbone"  # TRL calls getattr(model, model.base_model_prefix)(...)

    def __init__(self, score_texts: ScoreTexts, tokenizer: Any = None, *, context_length: int | None = None,
                 prompt_keys: Mapping[Sequence[int], str] | None = None, missing_score: float | None = None):
        super().__init__()
        if not callable(score_texts):
            raise ModelError("the PPO reward needs a callable score_texts(list of (prompt, response)) -> scores")
        if missing_score is not None and not math.isfinite(missing_score):
            raise ModelError(f"missing_score must be a finite number, not {missing_score!r}")
        self.score_texts = score_texts
        self.tokenizer = tokenizer
        self.context_length = context_length
        self.prompt_keys = {tuple(k): v for k, v in prompt_keys.items()} if prompt_keys is not None else None
        self.missing_score = missing_score
        self.calls = 0  # score_texts calls
        self.scored = 0  # (prompt, response) pairs scored

    def bind(self, tokenizer: Any, *, context_length: int, prompt_keys: Mapping[Sequence[int], str] | None = None):
        self.tokenizer = tokenizer
        self.context_length = int(context_length)
        self.prompt_keys = {tuple(k): v for k, v in prompt_keys.items()} if prompt_keys is not None else None
        return self

    # --- what TRL calls ----------------------------------------------------------------

    def backbone(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                 **_ignored: Any) -> _BackboneOutput:
        scores = self.score_ids(input_ids, attention_mask)
        hidden = scores.view(-1, 1, 1).expand(input_ids.shape[0], input_ids.shape[1], 1)
        return _BackboneOutput(hidden_states=(hidden,))

    def score(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return hidden_states

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                **_ignored: Any) -> torch.Tensor:
        """One score per row, shape (batch,)."""
        return self.score_ids(input_ids, attention_mask)

    # --- the work ----------------------------------------------------------------------

    def texts(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> list[tuple[str, str]]:
        """The (prompt, response) strings of each row, as the scorer receives them."""
        if self.tokenizer is None or self.context_length is None:
            raise ModelError("the PPO reward module is not bound to the policy's tokenizer and prompt length "
                             "(train_ppo binds it; call bind() to use it alone)")
        if input_ids.dim() != 2:
            raise ModelError(f"expected a (batch, length) tensor of token ids, got shape {tuple(input_ids.shape)}")
        length = self.context_length
        if input_ids.shape[1] < length:
            raise ModelError(f"rows of {input_ids.shape[1]} tokens are shorter than the prompt length {length}")
        if attention_mask is None:
            pad = self.tokenizer.pad_token_id
            attention_mask = torch.ones_like(input_ids, dtype=torch.bool) if pad is None else input_ids != pad
        ids = input_ids.detach().cpu().tolist()
        mask = attention_mask.detach().bool().cpu().tolist()
        pairs = []
        for row_ids, row_mask in zip(ids, mask):
            prompt_ids = [t for t, keep in zip(row_ids[:length], row_mask[:length]) if keep]
            response_ids = []
            for t, keep in zip(row_ids[length:], row_mask[length:]):
                if not keep:
                    break  # TRL reads the score just before the first pad of the response
                response_ids.append(t)
            pairs.append((self._prompt_text(prompt_ids), self._decode(response_ids)))
        return pairs

    def score_ids(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        pairs = self.texts(input_ids, attention_mask)
        raw = list(self.score_texts(pairs))
        self.calls += 1
        self.scored += len(pairs)
        if len(raw) != len(pairs):
            raise ModelError(f"the reward scorer returned {len(raw)} scores for {len(pairs)} responses")
        scores = []
        for (prompt, _), value in zip(pairs, raw):
            if value is None:
                if self.missing_score is None:
                    raise ModelError(f"the reward scorer gave no score for a response to {_short(prompt)!r} "
                                     "(set missing_score to train on through such failures)")
                value = self.missing_score
            try:
                value = float(value)
            except (TypeError, ValueError):
                raise ModelError(f"the reward scorer returned {value!r}, not a number") from None
            if not math.isfinite(value):
                raise ModelError(f"the reward scorer returned {value}, not a finite number")
            scores.append(value)
        return torch.tensor(scores, dtype=torch.float32, device=input_ids.device)

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True).strip()

    def _prompt_text(self, ids: list[int]) -> str:
        if self.prompt_keys is None:
            return self._decode(ids)
        key = self.prompt_keys.get(tuple(ids))
        if key is None:
            raise ModelError(f"a PPO prompt is not one the reward module was bound with: {_short(self._decode(ids))!r}")
        return key


def scalar_scorer(rm: Any, *, setting: str = "no_profile",
                  contexts: Mapping[str, ScoreInput] | None = None) -> ScoreTexts:
    """score_texts for a reward model that declares `scores_groups` (a ScalarRewardModel), one response
    per group, each re-rendered with the RM's own tokenizer and chat template.

    The prompt string is looked up in `contexts` (as `policy_prompts` makes them: item id ->
    ScoreInput with question, profile, plan), so the RM sees render_context for `setting`;
    a prompt not in `contexts` is taken as the question itself, with no profile."""
    if not rm.scores_groups:
        raise ModelError(f"{type(rm).__name__} cannot score single responses (it has no score_groups)")
    contexts = dict(contexts or {})

    def score_texts(pairs: list[tuple[str, str]]) -> list[float]:
        groups = []
        for i, (prompt, response) in enumerate(pairs):
            ctx = contexts.get(prompt)
            if ctx is None:
                groups.append(ScoreInput(id=str(i), question=prompt, responses=(response,)))
            else:
                groups.append(ScoreInput(id=str(i), question=ctx.question, responses=(response,),
                                         profile=tuple(ctx.profile), plan=tuple(ctx.plan)))
        by_id = dict(rm.score_groups(groups, setting=setting))
        return [by_id[str(i)][0] for i in range(len(pairs))]

    return score_texts


def pairwise_scorer(rm: Any, *, setting: str, contexts: Mapping[str, ScoreInput],
                    references: Mapping[str, str]) -> ScoreTexts:
    """score_texts for RMs that judge answers against each other (pairwise and pointwise
    judges, P-GenRM): each decoded response is compared with a fixed reference answer to the
    same question, and the reward is the RM's score of the response minus its score of the
    reference. The reference is the benchmark pair's rejected answer: a fluent answer that
    ignores the user's rubric, so the reward is how much better than rubric-blind the RM finds
    the policy's answer. A judge's parse failure gives None (see TextRewardModule.missing_score).
    """
    from prblib.rewards.base import PairInput

    def score_texts(pairs: list[tuple[str, str]]) -> list[float | None]:
        inputs = []
        for i, (key, response) in enumerate(pairs):
            ctx = contexts.get(key)
            if ctx is None or key not in references:
                raise ModelError(f"no question and reference answer for prompt {key!r}")
            inputs.append(PairInput(id=str(i), domain="", question=ctx.question, chosen=response,
                                    rejected=references[key], profile=tuple(ctx.profile), plan=tuple(ctx.plan)))
        results = {r.id: r for r in rm.score_pairs(inputs, setting=setting)}
        out: list[float | None] = []
        for i in range(len(pairs)):
            r = results.get(str(i))
            ok = r is not None and r.chosen_score is not None and r.rejected_score is not None
            out.append(float(r.chosen_score - r.rejected_score) if ok else None)
        return out

    return score_texts


@dataclass(frozen=True)
class PolicyPrompts:
    """Benchmark items prepared for PPO: what the policy sees, and what the reward side sees."""

    prompts: list[Messages]  # policy_messages(item) per item
    reward_prompts: list[str]  # the item ids: the prompt strings the scorer receives
    contexts: dict[str, ScoreInput]  # item id -> question, profile (and plan) for scalar_scorer


def policy_prompts(items: Iterable[Any], *, plans: Mapping[str, Sequence[str]] | None = None,
                   profile_k: int = DEFAULT_PROFILE_K) -> PolicyPrompts:
    """Prompts for `train_ppo(prompts=..., reward_prompts=...)` and contexts for `scalar_scorer`.
    The policy gets Best-of-N's prompt (question and top profile posts, never the rubric or
    narrative); the RM gets the question, profile and plan for its setting."""
    from prblib.downstream.bon import as_policy_item, policy_messages

    prompts, keys, contexts = [], [], {}
    for item in items:
        policy_item = as_policy_item(item, profile_k=profile_k)
        if policy_item.id in contexts:
            raise ModelError(f"item id {policy_item.id!r} appears twice")
        prompts.append(policy_messages(policy_item))
        keys.append(policy_item.id)
        contexts[policy_item.id] = ScoreInput(id=policy_item.id, question=policy_item.question, responses=(),
                                              profile=policy_item.profile,
                                              plan=tuple((plans or {}).get(policy_item.id, ())))
    return PolicyPrompts(prompts, keys, contexts)


# --------------------------------------------------------------------------------------------
# Training


@dataclass(frozen=True)
class PPOResult:
    steps: int  # PPO updates done (one batch of rollouts each)
    out_dir: str  # the trained policy (safetensors, config, tokenizer, ppo_run.json)
    stats: list[dict[str, float]]  # per logged step: step, mean_score (the RM's), kl, ...
    seconds: float
    algorithm: str = ALGORITHM
    settings: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# TRL metric name -> our stats name
STAT_NAMES = {"objective/scores": "mean_score", "objective/kl": "kl", "objective/rlhf_reward": "rlhf_reward",
              "objective/entropy": "entropy", "loss/policy_avg": "policy_loss", "loss/value_avg": "value_loss",
              "policy/approxkl_avg": "approx_kl", "policy/clipfrac_avg": "clip_fraction"}


def train_ppo(*, policy_path: str | os.PathLike, reward: TextRewardModule | ScoreTexts,
              prompts: Sequence[Prompt], out_dir: str | os.PathLike,
              reward_prompts: Sequence[str] | None = None, steps: int = 64, batch_size: int = 8, seed: int = 0,
              learning_rate: float = 3e-6, response_length: int = 256, device: str = "cpu",
              dtype: str = "float32", temperature: float = 0.7, kl_coef: float = 0.05, ppo_epochs: int = 4,
              mini_batches: int = 1, vf_coef: float = 0.1, cliprange: float = 0.2, cliprange_value: float = 0.2,
              gamma: float = 1.0, lam: float = 0.95, whiten_rewards: bool = False,
              critic_learning_rate: float | None = None, weight_decay: float = 0.0, lr_schedule: str = "linear",
              missing_score: float | None = None, threads: int | None = None,
              progress: Callable[[int], None] | None = None) -> PPOResult:
    """Train the policy in `policy_path` with PPO against `reward`; save it to `out_dir`.

    prompts: chat messages (a list of {role, content}, ending with a user turn) or plain text
    (taken as one user message), rendered with the policy's chat template and generation
    prompt exactly as LocalCausalLMBackend renders them (a transcript without a template).
    reward: a TextRewardModule, or a score_texts callable (wrapped in one, with missing_score).
    reward_prompts: per prompt, the string the scorer receives as the prompt (default: the
    last user message's text).
    steps: PPO updates; each samples `batch_size` prompts (reshuffled each pass over the
    data), generates up to `response_length` tokens at `temperature`, scores them, and runs
    `ppo_epochs` epochs over `mini_batches` mini-batches. `progress(1)` is called per step.
    learning_rate (one AdamW optimizer over policy and value model), vf_coef, kl_coef,
    cliprange, cliprange_value, gamma, lam and whiten_rewards are PPOConfig's fields of the same
    names (the knobs and their defaults: prblib.rewards.options.PPOOptions).
    critic_learning_rate: the value model's own AdamW rate (a second parameter group of the one
    optimizer TRL steps; verl's separate critic optimizer, as the release sets it); None: TRL's
    optimizer, one rate for both. weight_decay: AdamW's, for both groups (with it or a critic rate
    the optimizer is ours: torch AdamW, betas and eps at their defaults, as TRL's). lr_schedule:
    "linear" (TRL's default decay to 0) or "constant" (verl's default).
    out_dir: must be missing or empty; receives the trained policy (safetensors), its
    tokenizer and config, and ppo_run.json (the settings and per-step stats).
    """
    started = time.monotonic()
    _check_numbers(steps=steps, batch_size=batch_size, response_length=response_length, ppo_epochs=ppo_epochs,
                   mini_batches=mini_batches)
    for name, value in (("learning_rate", learning_rate), ("temperature", temperature), ("cliprange", cliprange),
                        ("cliprange_value", cliprange_value)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise ModelError(f"{name} must be a positive number, not {value!r}")
    if isinstance(kl_coef, bool) or not isinstance(kl_coef, (int, float)) or not math.isfinite(kl_coef) or kl_coef < 0:
        raise ModelError(f"kl_coef must be a number >= 0, not {kl_coef!r}")
    for name, value in (("vf_coef", vf_coef), ("gamma", gamma), ("lam", lam)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise ModelError(f"{name} must be a number >= 0, not {value!r}")
    if whiten_rewards and batch_size // mini_batches < 8:
        raise ModelError(f"whiten_rewards needs mini-batches of at least 8 rollouts (TRL's rule); batch_size "
                         f"{batch_size} / mini_batches {mini_batches} gives {batch_size // mini_batches}")
    if batch_size % mini_batches:
        raise ModelError(f"batch_size {batch_size} must be a multiple of mini_batches {mini_batches}")
    if critic_learning_rate is not None and not (isinstance(critic_learning_rate, (int, float))
                                                 and math.isfinite(critic_learning_rate) and critic_learning_rate > 0):
        raise ModelError(f"critic_learning_rate must be a positive number or None, not {critic_learning_rate!r}")
    if not (isinstance(weight_decay, (int, float)) and math.isfinite(weight_decay) and weight_decay >= 0):
        raise ModelError(f"weight_decay must be a number >= 0, not {weight_decay!r}")
    if lr_schedule not in ("linear", "constant"):
        raise ModelError(f"lr_schedule must be 'linear' or 'constant', not {lr_schedule!r}")
    messages = _prompt_messages(prompts)
    if batch_size > len(messages):
        raise ModelError(f"batch_size {batch_size} is larger than the {len(messages)} prompts given "
                         "(PPO needs at least one full batch)")
    if reward_prompts is None:
        keys = [next(m["content"] for m in reversed(msgs) if m["role"] == "user") for msgs in messages]
    else:
        keys = list(reward_prompts)
        if len(keys) != len(messages):
            raise ModelError(f"{len(keys)} reward prompts for {len(messages)} prompts")
        if not all(isinstance(k, str) for k in keys):
            raise ModelError("reward prompts must be strings")
    if isinstance(reward, TextRewardModule):
        reward_module = reward
    elif callable(reward):
        reward_module = TextRewardModule(reward, missing_score=missing_score)
    else:
        raise ModelError("reward must be a TextRewardModule or a callable score_texts")
    from prblib.modelcheck import check_model_folder

    policy_folder, _, _ = check_model_folder(Path(policy_path), task="causal-lm")
    out = _prepare_out_dir(Path(out_dir), policy_folder)

    from prblib.devices import DTYPES, resolve_device

    torch_device = resolve_device(device)
    if dtype not in DTYPES:
        raise ModelError(f"unknown dtype {dtype!r} for training (use {', '.join(DTYPES)})")
    torch_dtype = DTYPES[dtype]

    old_threads = torch.get_num_threads()
    if torch_device.type == "cpu":
        torch.set_num_threads(max(1, threads or min(DEFAULT_THREADS, os.cpu_count() or 1)))
    try:
        result = _train(policy_folder=policy_folder, reward_module=reward_module, messages=messages, keys=keys,
                        out=out, steps=steps, batch_size=batch_size, seed=seed, learning_rate=float(learning_rate),
                        response_length=response_length, torch_device=torch_device, torch_dtype=torch_dtype,
                        temperature=float(temperature), kl_coef=float(kl_coef), ppo_epochs=ppo_epochs,
                        mini_batches=mini_batches, progress=progress, started=started,
                        loss={"vf_coef": float(vf_coef), "cliprange": float(cliprange),
                              "cliprange_value": float(cliprange_value), "gamma": float(gamma), "lam": float(lam),
                              "whiten_rewards": bool(whiten_rewards)},
                        optimizer={"critic_learning_rate": critic_learning_rate, "weight_decay": float(weight_decay),
                                   "lr_schedule": lr_schedule})
    finally:
        torch.set_num_threads(old_threads)
    return result


def _train(*, policy_folder: Path, reward_module: TextRewardModule, messages: list[Messages], keys: list[str],
           out: Path, steps: int, batch_size: int, seed: int, learning_rate: float, response_length: int,
           torch_device: torch.device, torch_dtype: torch.dtype, temperature: float, kl_coef: float,
           ppo_epochs: int, mini_batches: int, progress: Callable[[int], None] | None,
           started: float, loss: dict[str, Any], optimizer: dict[str, Any] | None = None) -> PPOResult:
    import datasets
    import transformers
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer, TrainerCallback
    from trl.experimental.ppo import PPOConfig, PPOTrainer

    offline = {"local_files_only": True, "trust_remote_code": False}
    transformers.set_seed(seed)
    try:
        saved_tokenizer = AutoTokenizer.from_pretrained(policy_folder, **offline)
        policy = AutoModelForCausalLM.from_pretrained(policy_folder, dtype=torch_dtype, use_safetensors=True,
                                                      **offline)
        ref_policy = AutoModelForCausalLM.from_pretrained(policy_folder, dtype=torch_dtype, use_safetensors=True,
                                                          **offline)
    except (OSError, ValueError, KeyError) as exc:
        raise ModelError(f"cannot load the policy in {policy_folder}: {_short(str(exc))}") from None
    tokenizer = _trl_tokenizer(saved_tokenizer)
    pad_id = tokenizer.pad_token_id

    # The dataset: every prompt rendered, tokenized and left-padded to one length (see the
    # module docstring), so the reward module knows where each prompt ends.
    prompt_ids = [_render_ids(saved_tokenizer, msgs) for msgs in messages]
    for i, ids in enumerate(prompt_ids):
        if not ids:
            raise ModelError(f"prompt {i} renders to no tokens")
        if pad_id in ids:
            raise ModelError(f"prompt {i} contains the pad token {tokenizer.pad_token!r}, which PPO would treat "
                             "as padding")
    context_length = max(len(ids) for ids in prompt_ids)
    limit = int(getattr(policy.config.get_text_config(), "max_position_embeddings", 0) or 0)
    if limit and context_length + response_length > limit:
        raise ModelError(f"the longest prompt ({context_length} tokens) plus response_length {response_length} "
                         f"exceeds the policy's context of {limit} tokens")
    prompt_keys: dict[tuple[int, ...], str] = {}
    for ids, key in zip(prompt_ids, keys):
        if prompt_keys.setdefault(tuple(ids), key) != key:
            raise ModelError(f"two prompts render identically but have different reward prompts "
                             f"({prompt_keys[tuple(ids)]!r}, {key!r})")
    dataset = datasets.Dataset.from_dict(
        {"input_ids": [[pad_id] * (context_length - len(ids)) + ids for ids in prompt_ids]})

    if reward_module.tokenizer is None:
        reward_module.tokenizer = saved_tokenizer
    elif reward_module.tokenizer.get_vocab() != saved_tokenizer.get_vocab():
        raise ModelError("the reward module decodes with a different tokenizer than the policy's; "
                         "give it the policy's tokenizer (or none, and train_ppo sets it)")
    reward_module.bind(reward_module.tokenizer, context_length=context_length, prompt_keys=prompt_keys)

    try:
        value_model, info = AutoModelForSequenceClassification.from_pretrained(
            policy_folder, num_labels=1, dtype=torch_dtype, use_safetensors=True, output_loading_info=True,
            **offline)
    except (OSError, ValueError, KeyError) as exc:
        raise ModelError(f"cannot build a value model from the policy in {policy_folder}: {_short(str(exc))}") from None
    unexpected_missing = [k for k in info.get("missing_keys") or () if not k.startswith("score.")]
    if unexpected_missing:
        raise ModelError(f"the value model built from the policy lacks {len(unexpected_missing)} backbone tensors "
                         f"(e.g. {unexpected_missing[0]}); this architecture cannot serve as its own critic")
    value_model.config.pad_token_id = pad_id
    policy.config.pad_token_id = pad_id
    ref_policy.requires_grad_(False).eval()
    original_generation_config = copy.deepcopy(policy.generation_config)

    stop = {"stop_token": "eos"} if saved_tokenizer.eos_token_id is not None else {}
    optimizer = dict(optimizer or {})
    schedule = optimizer.get("lr_schedule", "linear")
    optimizers = (None, None)  # TRL's own: one AdamW over policy and value model at learning_rate
    if optimizer.get("critic_learning_rate") is not None or optimizer.get("weight_decay"):
        critic_lr = optimizer.get("critic_learning_rate") or learning_rate
        optimizers = (torch.optim.AdamW([
            {"params": [p for p in policy.parameters() if p.requires_grad], "lr": learning_rate},
            {"params": [p for p in value_model.parameters() if p.requires_grad], "lr": critic_lr}],
            lr=learning_rate, weight_decay=optimizer.get("weight_decay", 0.0)), None)
    with tempfile.TemporaryDirectory(prefix="ppo-trainer-") as scratch:
        config = PPOConfig(
            output_dir=scratch, seed=seed, data_seed=seed, learning_rate=learning_rate,
            per_device_train_batch_size=batch_size, gradient_accumulation_steps=1, num_mini_batches=mini_batches,
            local_rollout_forward_batch_size=batch_size, total_episodes=steps * batch_size,
            num_ppo_epochs=ppo_epochs, response_length=response_length, temperature=temperature,
            kl_coef=kl_coef, **loss, lr_scheduler_type=schedule, num_sample_generations=0,
            use_cpu=torch_device.type == "cpu",
            bf16=False, fp16=False, activation_checkpointing=False, save_strategy="no", report_to="none",
            logging_steps=1, disable_tqdm=True, dataloader_num_workers=0, **stop)
        _ = config.device  # sets up accelerate's shared state on the asked-for device before PPOTrainer does
        trainer = PPOTrainer(args=config, processing_class=tokenizer, model=policy, ref_model=ref_policy,
                             reward_model=reward_module, train_dataset=dataset, value_model=value_model,
                             optimizers=optimizers)
        if trainer.accelerator.device.type != torch_device.type:
            raise ModelError(f"PPO would run on {trainer.accelerator.device}, not on the {torch_device} asked for "
                             "(accelerate's device is set once per process)")
        for callback in (transformers.PrinterCallback, transformers.ProgressCallback):
            trainer.remove_callback(callback)
        if progress is not None:
            class _Progress(TrainerCallback):
                def on_step_end(self, args, state, control, **kwargs):
                    progress(1)

            trainer.add_callback(_Progress())
        trainer.train()
        history = list(trainer.state.log_history)
        trained = trainer.accelerator.unwrap_model(trainer.model).policy

    trained.generation_config = original_generation_config
    trained.save_pretrained(out, safe_serialization=True)
    saved_tokenizer.save_pretrained(out)
    stats = [_step_stats(i, entry) for i, entry in enumerate(
        (e for e in history if "objective/scores" in e), start=1)]
    settings = {"policy_path": str(policy_folder), "steps": steps, "batch_size": batch_size, "seed": seed,
                "learning_rate": learning_rate, "response_length": response_length, "temperature": temperature,
                "kl_coef": kl_coef, "ppo_epochs": ppo_epochs, "mini_batches": mini_batches, **loss,
                "critic_learning_rate": optimizer.get("critic_learning_rate"),
                "weight_decay": optimizer.get("weight_decay", 0.0), "lr_schedule": schedule,
                "device": str(torch_device), "dtype": str(torch_dtype).removeprefix("torch."),
                "prompts": len(messages), "context_length": context_length,
                "trl": _version("trl"), "transformers": transformers.__version__}
    result = PPOResult(steps=steps, out_dir=str(out), stats=stats, seconds=round(time.monotonic() - started, 3),
                       settings=settings)
    (out / RUN_INFO_FILE).write_text(json.dumps(result.as_dict(), indent=2, ensure_ascii=False), encoding="utf-8")
    return result


def _trl_tokenizer(tokenizer: Any) -> Any:
    """The tokenizer TRL is given: a copy with a pad and an eos token (module docstring)."""
    tok = copy.deepcopy(tokenizer)
    if tok.pad_token is None:
        if tok.unk_token is not None:
            tok.pad_token = tok.unk_token
        elif tok.eos_token is not None:
            log.warning("the policy tokenizer has no pad or unk token; padding with eos %r, so PPO masks EOS "
                        "out of the loss", tok.eos_token)
            tok.pad_token = tok.eos_token
        else:
            raise ModelError("the policy tokenizer has no pad, unk or eos token to pad with")
    elif tok.eos_token is not None and tok.pad_token_id == tok.eos_token_id:
        log.warning("the policy tokenizer pads with its eos token %r: PPO masks EOS out of the loss", tok.eos_token)
    if tok.eos_token is None:
        tok.eos_token = tok.pad_token  # only counted in TRL's metrics; not a stop token (none is set)
    tok.padding_side = "left"
    return tok


# --------------------------------------------------------------------------------------------
# Answers from a trained policy


@dataclass(frozen=True)
class PolicyAnswer:
    """One answer of the trained policy. truncated: it still stopped at the token cap (no
    end-of-sequence token among its new token ids) after one retry with twice the budget;
    retried: the first attempt stopped at the cap."""

    text: str
    truncated: bool = False
    retried: bool = False


def generate_answers(policy_path: str | os.PathLike, prompts: Sequence[Prompt], *, max_new_tokens: int = 256,
                     seed: int | None = 0, temperature: float = 0.0, device: str = "cpu",
                     dtype: str = "auto", top_p: float | None = None) -> list[PolicyAnswer]:
    """One answer per prompt from the policy folder, in order: greedy at temperature 0, else
    sampled with `seed` (each prompt's request seeded alike, as in Best-of-N; `top_p` nucleus
    sampling when set). Prompts are
    rendered as in train_ppo; answers are decoded without special tokens and stripped.

    Truncation: an answer whose new tokens hold no end-of-sequence id stopped at the cap (the
    backend's finish reason "length", decided from the output ids whatever the decoder). Through
    `llm.ask` it is generated once more with 2 * max_new_tokens; still cut, it is returned with
    truncated=True (its text as generated), never dropped: the caller grades and counts it."""
    from prblib.llm.answers import AnswerError
    from prblib.llm.client import LocalCausalLMBackend, ask
    from prblib.modelcheck import check_model_folder

    _check_numbers(max_new_tokens=max_new_tokens)
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not temperature >= 0:
        raise ModelError(f"temperature must be a number >= 0, not {temperature!r}")
    messages = _prompt_messages(prompts)
    folder, _, _ = check_model_folder(Path(policy_path), task="causal-lm")
    backend = LocalCausalLMBackend(folder, device=device, dtype=dtype)
    answers = []
    try:
        for msgs in messages:
            retried_before = backend.events["truncated_retried"]
            try:
                [answer] = ask(backend, msgs, temperature=temperature, max_tokens=max_new_tokens, seed=seed, n=1,
                               what="policy answer", refusals="keep", top_p=top_p)
                answers.append(PolicyAnswer(answer.text, retried=backend.events["truncated_retried"] > retried_before))
            except AnswerError as exc:
                if exc.reason != "truncated":
                    raise
                answers.append(PolicyAnswer(exc.text, truncated=True, retried=True))
    finally:
        backend.close()
    return answers


# --------------------------------------------------------------------------------------------
# Helpers


def _prompt_messages(prompts: Sequence[Prompt]) -> list[Messages]:
    if isinstance(prompts, (str, Mapping)) or not isinstance(prompts, Sequence):
        raise ModelError("prompts must be a list of prompts (each chat messages or a text)")
    if not prompts:
        raise ModelError("no prompts given")
    return [_as_messages(prompt, i) for i, prompt in enumerate(prompts)]


def _as_messages(prompt: Prompt, index: int) -> Messages:
    if isinstance(prompt, str):
        if not prompt.strip():
            raise ModelError(f"prompt {index} is empty")
        return [{"role": "user", "content": prompt}]
    if isinstance(prompt, Mapping) or not isinstance(prompt, Sequence) or not prompt:
        raise ModelError(f"prompt {index} must be a text or a non-empty list of {{role, content}} messages")
    messages = []
    for message in prompt:
        if not isinstance(message, Mapping) or message.get("role") not in ROLES \
                or not isinstance(message.get("content"), str):
            raise ModelError(f"prompt {index}: each message needs a role ({', '.join(ROLES)}) and text content, "
                             f"got {_short(repr(message))}")
        messages.append({"role": message["role"], "content": message["content"]})
    if messages[-1]["role"] != "user" or not messages[-1]["content"].strip():
        raise ModelError(f"prompt {index} must end with a non-empty user message")
    return messages


def _render_ids(tokenizer: Any, messages: Messages) -> list[int]:
    """The prompt's token ids, rendered (bounded; a system message folded into the first user turn
    when the template refuses one: `chat.render_for_model`) and tokenized as LocalCausalLMBackend does."""
    from prblib.chat import ChatTemplateError, render_for_model
    from prblib.llm.client import chat_template_of

    template, special = chat_template_of(tokenizer)
    templated = template is not None
    if templated:
        try:
            text = render_for_model(template, messages, special_tokens=special)
        except ChatTemplateError as exc:
            raise ModelError(f"the policy's prompt: {_short(str(exc))}") from None
    else:
        text = messages_as_text(messages) + "\n\n[assistant]\n"
    return list(tokenizer(text, add_special_tokens=not templated)["input_ids"])


def _prepare_out_dir(out: Path, policy_folder: Path) -> Path:
    out = out.resolve()
    if out == policy_folder or policy_folder.is_relative_to(out):
        raise ModelError(f"out_dir {out} would overwrite the policy being trained")
    if out.exists():
        if not out.is_dir():
            raise ModelError(f"out_dir {out} is a file, not a folder")
        if any(out.iterdir()):
            raise ModelError(f"out_dir {out} is not empty (a trained policy is never written over another)")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ModelError(f"cannot create out_dir {out}: {exc.strerror}") from None
    return out


def _check_numbers(**values: Any) -> None:
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ModelError(f"{name} must be a whole number >= 1, not {value!r}")


def _step_stats(step: int, entry: Mapping[str, Any]) -> dict[str, float]:
    stats: dict[str, float] = {"step": step}
    for trl_name, name in STAT_NAMES.items():
        if isinstance(entry.get(trl_name), (int, float)):
            stats[name] = float(entry[trl_name])
    return stats


def _version(package: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return "unknown"


def _short(text: str, limit: int = 200) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit] + "..."
