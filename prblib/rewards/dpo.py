"""DPO models as implicit reward models (kind "dpo"): a policy and the reference it was trained
from, both local causal-LM folders.

The reward (RewardBench's definition for DPO models: Lambert et al. 2024, "RewardBench",
section 3; its `DPOInference.inference_step`) of an answer y to a prompt x is

    r(x, y) = beta * sum_{t in answer} [ log pi_policy(y_t | x, y_<t) - log pi_ref(y_t | x, y_<t) ]

in nats: the log-probability the policy gives the answer's tokens minus the reference model's,
summed over the answer's tokens only (the prompt's tokens are not scored). DPO's implicit reward
is beta times that log-ratio (Rafailov et al. 2023, eq. 5; the partition term cancels between two
answers to the same prompt); RewardBench reports beta = 1, and since beta > 0 scales every reward
alike, it never changes which answer wins (options.beta, default 1).

Reference-free variant (options.reference_free): no reference model; the reward is computed from
the policy's per-token log-probabilities l_t of the answer alone, as RewardBench's ref-free rows
do, by `reference_free_norm`:
- "avg" (the default, RewardBench's `--ref_free_type` default): the mean, sum_t l_t / T, i.e.
  length-normalised;
- "sum": sum_t l_t (not normalised: longer answers score lower);
- "norm": -||(l_1, ..., l_T)||_2 (RewardBench's "norm").
beta multiplies these too.

Where the answer's tokens are. The user turn is render_context(question, setting, ...), as every
kind renders it.
- With a chat template (rendered bounded, `chat.render_chat`): the prompt is the template applied
  to [user] with add_generation_prompt=True, the full text the template applied to [user,
  assistant: answer] without it; the answer's text is what the full text adds after the prompt
  (a template whose full text does not start with its prompt is refused, naming the pair: its
  answer tokens cannot be located). So the answer's tokens include the template's end-of-turn
  markup, as the DPO loss saw them in training.
- Without one: plain concatenation, prompt = context + "\\n\\n", answer = the answer's text.
Token ids: [BOS] + tokens(prompt) + tokens(answer) + [EOS], each part tokenized on its own without
special tokens (RewardBench and TRL's DPO tokenization); BOS is added only when the tokenizer has
one and the prompt does not already start with it (a template writing {{ bos_token }}), EOS only
when the tokenizer has one and the answer's tokens do not already end with it. The scored tokens
are tokens(answer) + [EOS].

Length. The limit is min(spec.max_length, the model's max_position_embeddings). A text that does
not fit drops the lowest-ranked profile posts until both answers fit (details["truncated_posts"]);
the question and the answers are never cut; a pair that does not fit without posts is refused.

Numerics: forward passes in the spec's dtype ("auto": float32 on CPU, bfloat16 on CUDA), the
log-softmax in float32; batches right-padded (padding never reaches the unpadded tokens under the
causal mask), only the logits from the first answer position on are computed (`logits_to_keep`).

Loading never runs code from a folder: both folders pass `modelcheck.check_model_folder` (causal
LM, safetensors only, no custom code, every file inside the models root) before transformers
opens them; nothing is downloaded. Plain Python; no Django.
"""

from __future__ import annotations

import gc
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from prblib import registry
from prblib.rewards.base import ModelSpec, PairInput, PairResult, ProgressFn, ScoreInput, check_setting
from prblib.errors import ModelError
from prblib.context import render_context
from prblib.devices import resolve_device, resolve_dtype
from prblib.modelcheck import check_model_folder
from prblib.rewards.options import parse_options

PLAIN_SEPARATOR = "\n\n"  # prompt and answer without a chat template


@dataclass(frozen=True)
class _Sequence:
    ids: tuple[int, ...]
    start: int  # index of the first answer token in ids (>= 1)
    text: str  # prompt + answer as rendered (for --dump-inputs)


@dataclass(frozen=True)
class _Prepared:
    sequences: tuple[_Sequence, ...]
    truncated_posts: int


def reduce_logps(token_logps: Sequence[float], *, reference_free: bool, norm: str) -> float:
    """The policy's (or reference's) contribution from per-token log-probs (nats): the sum, or
    with reference_free and norm "avg" the mean, "norm" minus the L2 norm (see the module
    docstring). Raises ValueError for an empty answer."""
    if not token_logps:
        raise ValueError("an answer with no tokens has no log-probability")
    if not reference_free or norm == "sum":
        return math.fsum(token_logps)
    if norm == "avg":
        return math.fsum(token_logps) / len(token_logps)
    if norm == "norm":
        return -math.sqrt(math.fsum(v * v for v in token_logps))
    raise ValueError(f"unknown reference_free_norm {norm!r}")


class DPORewardModel:
    kind = "dpo"
    scores_groups = True  # each Best-of-N response is scored on its own

    def __init__(self, *, spec: ModelSpec, policy: Any, reference: Any | None, tokenizer: Any, max_length: int,
                 device: torch.device):
        self.spec = spec
        self.policy, self.reference, self.tokenizer = policy, reference, tokenizer
        self.max_length, self.device = max_length, device
        options = parse_options(self.kind, spec.options)
        self.beta = float(options.beta)
        self.reference_free = bool(options.reference_free)
        self.norm = options.reference_free_norm
        from prblib.llm.client import chat_template_of

        self.chat_template, self.special_tokens = chat_template_of(tokenizer)
        self.pad_id = next((i for i in (tokenizer.pad_token_id, tokenizer.eos_token_id, 0) if i is not None))

    # --- loading -----------------------------------------------------------------------

    @classmethod
    def load(cls, spec: ModelSpec) -> DPORewardModel:
        options = parse_options(cls.kind, spec.options)  # refuse unknown options before loading anything
        if spec.batch_size < 1:
            raise ModelError(f"batch size must be at least 1, not {spec.batch_size}")
        root = spec.runtime.get("models_root")
        task = registry.kind(cls.kind).model_task
        policy_folder, _, _ = check_model_folder(Path(spec.path), task=task, models_root=Path(root) if root else None)
        reference_folder = None
        if not options.reference_free:
            reference_folder, _, _ = check_model_folder(Path(options.reference), task=task,
                                                        models_root=Path(root) if root else None)
        device = resolve_device(spec.device)
        dtype = resolve_dtype(spec.dtype, device)
        from transformers import AutoModelForCausalLM, AutoTokenizer

        offline = {"local_files_only": True, "trust_remote_code": False}
        try:
            tokenizer = AutoTokenizer.from_pretrained(policy_folder, **offline)
        except (OSError, ValueError, KeyError) as exc:
            raise ModelError(f"cannot read the policy's tokenizer in {policy_folder.name}: {exc}") from None
        models = []
        for which, folder in (("policy", policy_folder), ("reference", reference_folder)):
            if folder is None:
                models.append(None)
                continue
            try:
                model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, use_safetensors=True, **offline)
            except (OSError, ValueError, RuntimeError) as exc:
                raise ModelError(f"cannot load the {which} model in {folder.name}: {exc}") from None
            models.append(model.to(device).eval())
        policy, reference = models
        if reference is not None:
            vocab = (policy.get_output_embeddings().weight.shape[0], reference.get_output_embeddings().weight.shape[0])
            if vocab[0] != vocab[1]:
                raise ModelError(f"the policy and the reference have different vocabularies ({vocab[0]} and "
                                 f"{vocab[1]} tokens): the reference must be the model the policy was trained from")
        limits = [spec.max_length]
        for model in (policy, reference):
            positions = getattr(model.config.get_text_config(), "max_position_embeddings", None) if model else None
            if isinstance(positions, int) and positions > 0:
                limits.append(positions)
        return cls(spec=spec, policy=policy, reference=reference, tokenizer=tokenizer, max_length=min(limits),
                   device=device)

    def usage(self) -> None:
        """None: no LLM backend is billed."""
        return None

    def reusable(self) -> bool:
        return self.policy is not None  # not closed

    def close(self) -> None:
        if self.policy is None:
            return
        on_cuda = self.device.type == "cuda"
        self.policy = self.reference = None
        gc.collect()
        if on_cuda:
            torch.cuda.empty_cache()

    # --- scoring -----------------------------------------------------------------------

    def render_inputs(self, pair: PairInput, *, setting: str) -> tuple[str, str]:
        check_setting(setting, pair)
        prepared = self._prepare(pair.id, pair.question, (pair.chosen, pair.rejected), profile=pair.profile,
                                 plan=pair.plan, setting=setting)
        return prepared.sequences[0].text, prepared.sequences[1].text

    def score_pairs(self, pairs: Sequence[PairInput], *, setting: str,
                    progress: ProgressFn | None = None) -> Iterator[PairResult]:
        """One PairResult per pair (in order); every pair is rendered and length-checked first.
        details: truncated_posts, tokens (answer tokens scored, chosen and rejected),
        policy_logps and reference_logps (summed log-probs in nats; reference null when reference-free)."""
        pairs = list(pairs)
        for pair in pairs:
            check_setting(setting, pair)
        prepared = [self._prepare(p.id, p.question, (p.chosen, p.rejected), profile=p.profile, plan=p.plan,
                                  setting=setting) for p in pairs]
        for pair, prep, (rewards, policy, reference) in zip(pairs, prepared, self._score(prepared, progress)):
            yield PairResult(id=pair.id, chosen_score=rewards[0], rejected_score=rewards[1],
                             details={"truncated_posts": prep.truncated_posts,
                                      "tokens": [len(s.ids) - s.start for s in prep.sequences],
                                      "policy_logps": policy, "reference_logps": reference})

    def score_groups(self, groups: Sequence[ScoreInput], *, setting: str,
                     progress: ProgressFn | None = None) -> Iterator[tuple[str, list[float]]]:
        """(group id, one reward per response in order) per group (Best-of-N)."""
        groups = list(groups)
        for group in groups:
            check_setting(setting, group)
            if not group.responses:
                raise ModelError(f"group {group.id!r} has no responses")
        prepared = [self._prepare(g.id, g.question, g.responses, profile=g.profile, plan=g.plan, setting=setting)
                    for g in groups]
        for group, (rewards, _, _) in zip(groups, self._score(prepared, progress)):
            yield group.id, rewards

    def _score(self, prepared: list[_Prepared], progress: ProgressFn | None
               ) -> Iterator[tuple[list[float], list[float], list[float] | None]]:
        """Per prepared item, in order: (rewards, policy sums, reference sums or None), a batch of
        items (about batch_size sequences) at a time."""
        step = max(1, self.spec.batch_size // max(1, max((len(p.sequences) for p in prepared), default=1)))
        for first in range(0, len(prepared), step):
            chunk = prepared[first:first + step]
            sequences = [s for p in chunk for s in p.sequences]
            policy = answer_logps(self.policy, sequences, pad_id=self.pad_id, device=self.device,
                                  batch_size=self.spec.batch_size)
            reference = None if self.reference is None else answer_logps(
                self.reference, sequences, pad_id=self.pad_id, device=self.device, batch_size=self.spec.batch_size)
            at = 0
            for prep in chunk:
                n = len(prep.sequences)
                mine = policy[at:at + n]
                theirs = None if reference is None else reference[at:at + n]
                at += n
                rewards = []
                for i in range(n):
                    value = reduce_logps(mine[i], reference_free=self.reference_free, norm=self.norm)
                    if theirs is not None:
                        value -= reduce_logps(theirs[i], reference_free=False, norm="sum")
                    rewards.append(self.beta * value)
                yield (rewards, [math.fsum(v) for v in mine],
                       None if theirs is None else [math.fsum(v) for v in theirs])
                if progress is not None:
                    progress(1)

    # --- rendering ---------------------------------------------------------------------

    def split_texts(self, context: str, response: str) -> tuple[str, str]:
        """(prompt text, answer text) for one user turn and answer (see the module docstring);
        ModelError when the template's full text does not start with its prompt."""
        if self.chat_template is None:
            return context + PLAIN_SEPARATOR, response
        from prblib.chat import render_chat

        user = {"role": "user", "content": context}
        prompt = render_chat(self.chat_template, [user], add_generation_prompt=True,
                             special_tokens=self.special_tokens)
        full = render_chat(self.chat_template, [user, {"role": "assistant", "content": response}],
                           add_generation_prompt=False, special_tokens=self.special_tokens)
        if not full.startswith(prompt):
            raise ModelError("the chat template does not render the conversation as its generation prompt "
                             "followed by the answer, so the answer's tokens cannot be located")
        return prompt, full[len(prompt):]

    def token_ids(self, prompt: str, answer: str) -> tuple[tuple[int, ...], int]:
        """(ids, index of the first answer token): [BOS] + prompt + answer + [EOS] (module docstring)."""
        tokenizer = self.tokenizer
        prompt_ids = list(tokenizer(prompt, add_special_tokens=False)["input_ids"])
        answer_ids = list(tokenizer(answer, add_special_tokens=False)["input_ids"])
        bos, eos = tokenizer.bos_token_id, tokenizer.eos_token_id
        if bos is not None and prompt_ids[:1] != [bos]:
            prompt_ids.insert(0, bos)
        if eos is not None and answer_ids[-1:] != [eos]:
            answer_ids.append(eos)
        if not prompt_ids:
            raise ModelError("the prompt has no tokens and the tokenizer no BOS token: the answer's first token "
                             "has nothing to be predicted from")
        if not answer_ids:
            raise ModelError("an answer has no tokens and the tokenizer no EOS token to score")
        return tuple(prompt_ids + answer_ids), len(prompt_ids)

    def _prepare(self, item_id: str, question: str, responses: Sequence[str], *, profile: Sequence[str],
                 plan: Sequence[str], setting: str) -> _Prepared:
        posts = len(profile[:self.spec.profile_k]) if setting == "profile" else 0
        first_longest = 0
        for keep in range(posts, -1, -1):
            context = render_context(question, setting=setting, profile=profile, plan=plan,
                                     profile_k=self.spec.profile_k, keep_posts=keep)
            sequences = []
            for response in responses:
                try:
                    prompt, answer = self.split_texts(context, response)
                except ModelError as exc:
                    raise ModelError(f"pair {item_id!r}: {exc}") from None
                ids, start = self.token_ids(prompt, answer)
                sequences.append(_Sequence(ids=ids, start=start, text=prompt + answer))
            longest = max(len(s.ids) for s in sequences)
            if longest <= self.max_length:
                return _Prepared(sequences=tuple(sequences), truncated_posts=posts - keep)
            first_longest = first_longest or longest
        raise ModelError(f"pair {item_id!r} does not fit the model's {self.max_length} tokens: {first_longest} "
                         f"tokens as given, {longest} with no profile posts left; the question and the answers "
                         "are never cut")


@torch.no_grad()
def answer_logps(model: Any, sequences: Sequence[_Sequence], *, pad_id: int, device: torch.device,
                 batch_size: int) -> list[list[float]]:
    """For each sequence (in order), the log-probabilities (nats, float32 log-softmax) the model
    gives its answer tokens ids[start:], each predicted from the tokens before it: a list of
    len(ids) - start floats. Sequences are batched by length, right-padded with `pad_id` (masked)."""
    out: list[list[float]] = [[] for _ in sequences]
    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i].ids))
    for first in range(0, len(order), batch_size):
        batch = [sequences[i] for i in order[first:first + batch_size]]
        width = max(len(s.ids) for s in batch)
        ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, s in enumerate(batch):
            ids[row, :len(s.ids)] = torch.tensor(s.ids, dtype=torch.long)
            mask[row, :len(s.ids)] = 1
        keep = width - min(s.start for s in batch) + 1  # logits from the position before the first answer token
        logits = model(input_ids=ids.to(device), attention_mask=mask.to(device), logits_to_keep=keep).logits
        logps = torch.log_softmax(logits.float(), dim=-1)
        offset = width - logits.shape[1]  # position of logits[:, 0]
        for row, (index, s) in enumerate(zip(order[first:first + batch_size], batch)):
            positions = torch.arange(s.start - 1, len(s.ids) - 1, device=logps.device) - offset
            targets = torch.tensor(s.ids[s.start:], dtype=torch.long, device=logps.device)
            out[index] = logps[row, positions, targets].tolist()
    return out
