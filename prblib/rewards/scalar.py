"""Scalar reward models: a transformers sequence-classification model whose logit is the score.

What the model is given. The user turn is render_context(question, setting, ...): the
question alone, after the top-k profile posts, or after the planner's aspects; never a
narrative or rubric (PairInput has no field for them). The assistant turn is the response.
- With a chat template in the tokenizer, the text is the template applied to
  [user: context, assistant: response] (no generation prompt).
- Without one, the plain format PLAIN_FORMAT below.
Special tokens: the text is tokenized with add_special_tokens=True, except when the chat
template already writes the tokens the tokenizer would prepend (a template starting with
{{ bos_token }}), where adding them again would give two BOS tokens.

Which number is the score.
- One label: that logit.
- Two labels: the log-odds of the positive class, logits[pos] - logits[other]; softmax only
  sees logit differences, so a raw logit alone would not rank by P(pos). The positive class
  is the id2label entry whose name reads as positive (POSITIVE_LABELS, e.g. "LABEL_1",
  "positive", "chosen", "good") when exactly one does, else index 1.
- More labels: refused.

Protocol "release" (options.protocol; docs/protocols.md): what the authors' released scalar
script computes. The user turn is the question alone (no profile, plan or heading) and the
assistant turn the response, through the tokenizer's chat template (required: the release has
no other format), tokenized with the tokenizer's own special tokens added (as the release does,
even where the template writes a BOS already); a head of two labels is read as the softmax at
its last index (one label: the logit, as ours). It runs in the no_profile setting only (a
benchmark evaluation in another setting is refused; Best-of-N groups are scored with the same
rule). Ours never cuts a text (the release truncates at 8192 tokens): a pair too long is refused.

Length. The limit is min(spec.max_length, the model's and tokenizer's maximum). A text that
does not fit drops the lowest-ranked profile posts, one at a time, until every response of
the pair (or group) fits with the same context; the response and the question are never
cut. details["truncated_posts"] says how many posts were dropped. A pair that does not fit
even without posts is refused with a ModelError naming it.

Runtime. dtype "auto" is float32 on CPU and bfloat16 on CUDA (float16 on GPUs without
bfloat16); "float32", "bfloat16" and "float16" may be asked for. Causal decoders run through
engine.ScoringEngine's prefix cache (each prompt computed once for all its responses), except
a model whose rotary embedding changes with the call's length ("longrope", "dynamic"), which
is scored one text at a time; encoders in plain batches. A self-check at load compares the ways on a sample against
transformers' own forward pass and falls back to a plainer way if they disagree.

spec.options for this kind:
- models_root (str): refuse a folder that resolves outside it (as the submission check does).
- prefix_cache (bool, default True): False scores every response in full (slower, same scores).

Loading never runs code from the folder: modelcheck refuses configs asking for it before
transformers sees the folder, weights come only from safetensors, nothing is downloaded.
"""

from __future__ import annotations

import gc
import logging
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
from prblib.rewards.engine import ScoringEngine, Unit
from prblib.modelcheck import check_model_folder
from prblib.rewards.options import parse_options, release_setting_refusal

log = logging.getLogger(__name__)

PLAIN_FORMAT = "User: {context}\n\nAssistant: {response}"
POSITIVE_LABELS = frozenset({"label_1", "1", "positive", "pos", "chosen", "good", "better", "preferred",
                             "yes", "true", "accept", "accepted"})
SANE_MAX_LENGTH = 10_000_000  # tokenizers without a limit report a huge sentinel instead
SELF_CHECK_TOLERANCE = {torch.float32: 1e-3, torch.bfloat16: 5e-2, torch.float16: 2e-2}


@dataclass(frozen=True)
class _Prepared:
    texts: tuple[str, ...]
    ids: tuple[tuple[int, ...], ...]
    truncated_posts: int


def positive_label_index(id2label: dict[Any, str]) -> int:
    """Index of the positive class of a two-class head (see the module docstring)."""
    hits = [int(i) for i, name in id2label.items() if str(name).strip().lower() in POSITIVE_LABELS]
    return hits[0] if len(hits) == 1 else 1


class ScalarRewardModel:
    kind = "scalar"
    scores_groups = True  # Best-of-N groups scored at once (the shared prompt computed once)

    def __init__(self, *, spec: ModelSpec, model: Any, tokenizer: Any, max_length: int,
                 label_index: int, negative_index: int | None, skip_id: int | None):
        self.spec = spec
        self.model = model
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.uses_chat_template = bool(getattr(tokenizer, "chat_template", None))
        # The decoder's score is read at the rightmost token that is not its configured pad
        # token, which is where transformers reads it for one unpadded sequence.
        self.skip_id = skip_id
        options = parse_options(self.kind, spec.options)
        self.protocol = options.protocol
        if self.protocol == "release" and not self.uses_chat_template:
            raise ModelError("protocol 'release' renders the question and the answer with the tokenizer's chat "
                             "template, as the authors' script does, and this tokenizer has none")
        self.add_special_tokens = True
        if self.uses_chat_template and self.protocol != "release":
            self.add_special_tokens = not _template_writes_leading_specials(
                tokenizer, self._render("Question?", "Answer."))
        self.engine = ScoringEngine(model, pad_id=tokenizer.pad_token_id, batch_size=spec.batch_size,
                                    label_index=label_index, negative_index=negative_index,
                                    softmax_last=self.protocol == "release")
        if self.engine.mode == "prefix" and not options.prefix_cache:
            self.engine.mode = "full"
        dtype = next(model.parameters()).dtype
        note = self.engine.check_prefix_mode(self._sample_units(), tolerance=SELF_CHECK_TOLERANCE[dtype],
                                             shipped_pad_id=skip_id)
        if note:
            log.warning("%s: %s", spec.path, note)

    # --- loading -----------------------------------------------------------------------

    @classmethod
    def load(cls, spec: ModelSpec) -> ScalarRewardModel:
        parse_options(cls.kind, spec.options)  # refuse unknown options before loading anything
        root = spec.runtime.get("models_root")
        folder, _, _ = check_model_folder(Path(spec.path), task=registry.kind(cls.kind).model_task,
                                          models_root=Path(root) if root else None)
        if spec.batch_size < 1:
            raise ModelError(f"batch size must be at least 1, not {spec.batch_size}")
        device = resolve_device(spec.device)
        dtype = resolve_dtype(spec.dtype, device)
        from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

        offline = {"local_files_only": True, "trust_remote_code": False}
        try:
            config = AutoConfig.from_pretrained(folder, **offline)
            tokenizer = AutoTokenizer.from_pretrained(folder, **offline)
        except (OSError, ValueError, KeyError) as exc:
            raise ModelError(f"cannot read the model's config or tokenizer in {folder}: {exc}") from None
        label_index, negative_index = 0, None
        if config.num_labels == 2:
            label_index = positive_label_index(config.id2label)
            negative_index = 1 - label_index
        elif config.num_labels != 1:
            raise ModelError(f"a scalar reward model needs 1 or 2 labels; this one has {config.num_labels}")
        try:
            model, info = AutoModelForSequenceClassification.from_pretrained(
                folder, config=config, dtype=dtype, use_safetensors=True, output_loading_info=True, **offline)
        except (OSError, ValueError, RuntimeError) as exc:
            raise ModelError(f"cannot load the model in {folder}: {exc}") from None
        missing = list(info.get("missing_keys") or ())
        if missing:
            raise ModelError(f"the weights lack {len(missing)} tensors the model needs (e.g. {missing[0]}): "
                             "they would be random; is this a sequence-classification checkpoint?")

        skip_id = model.config.pad_token_id
        if tokenizer.pad_token is None:
            if tokenizer.eos_token is None and tokenizer.unk_token is None:
                raise ModelError("the tokenizer has no pad, eos or unk token to pad batches with")
            tokenizer.pad_token = tokenizer.eos_token if tokenizer.eos_token is not None else tokenizer.unk_token
        if model.config.pad_token_id is None:
            model.config.pad_token_id = tokenizer.pad_token_id
        model.to(device).eval()
        return cls(spec=spec, model=model, tokenizer=tokenizer, max_length=_max_length(spec, config, tokenizer),
                   label_index=label_index, negative_index=negative_index, skip_id=skip_id)

    def usage(self) -> None:
        """None: a scalar RM calls no LLM, so there is no token bill."""
        return None

    def reusable(self) -> bool:
        return self.engine is not None  # not closed

    def close(self) -> None:
        if self.engine is None:  # closed already
            return
        on_cuda = self.engine.device.type == "cuda"
        self.engine = self.model = None
        gc.collect()
        if on_cuda:
            torch.cuda.empty_cache()

    # --- scoring -----------------------------------------------------------------------

    def _check_pair_setting(self, setting: str, pair: PairInput) -> None:
        check_setting(setting, pair)
        refusal = release_setting_refusal(self.protocol, setting)
        if refusal:
            raise ModelError(refusal)

    def render_inputs(self, pair: PairInput, *, setting: str) -> tuple[str, str]:
        self._check_pair_setting(setting, pair)
        prepared = self._prepare(pair.id, pair.question, (pair.chosen, pair.rejected),
                                 profile=pair.profile, plan=pair.plan, setting=setting)
        return prepared.texts[0], prepared.texts[1]

    def score_pairs(self, pairs: Sequence[PairInput], *, setting: str,
                    progress: ProgressFn | None = None) -> Iterator[PairResult]:
        """Yield one PairResult per pair as batches finish. Every pair is rendered and
        length-checked before the first forward pass, so a bad pair fails the run at once."""
        for pair in pairs:
            self._check_pair_setting(setting, pair)
        prepared = [self._prepare(p.id, p.question, (p.chosen, p.rejected), profile=p.profile, plan=p.plan,
                                  setting=setting) for p in pairs]
        for key, scores in self._score(prepared, progress):
            prep = prepared[key]
            yield PairResult(id=pairs[key].id, chosen_score=scores[0], rejected_score=scores[1],
                             details={"truncated_posts": prep.truncated_posts,
                                      "tokens": [len(prep.ids[0]), len(prep.ids[1])]})

    def score_groups(self, groups: Sequence[ScoreInput], *, setting: str,
                     progress: ProgressFn | None = None) -> Iterator[tuple[str, list[float]]]:
        """Yield (group id, one score per response in order) as batches finish (Best-of-N)."""
        for group in groups:
            check_setting(setting, group)
            if not group.responses:
                raise ModelError(f"group {group.id!r} has no responses")
        prepared = [self._prepare(g.id, g.question, g.responses, profile=g.profile, plan=g.plan, setting=setting)
                    for g in groups]
        for key, scores in self._score(prepared, progress):
            yield groups[key].id, scores

    def _score(self, prepared: list[_Prepared], progress: ProgressFn | None) -> Iterator[tuple[int, list[float]]]:
        units = [Unit(key=i, sequences=p.ids, positions=tuple(self._score_position(s) for s in p.ids))
                 for i, p in enumerate(prepared)]
        for key, scores in self.engine.score(units):
            yield key, scores
            if progress is not None:
                progress(1)

    # --- rendering ---------------------------------------------------------------------

    def _render(self, context: str, response: str) -> str:
        if not self.uses_chat_template:
            return PLAIN_FORMAT.format(context=context, response=response)
        from prblib.chat import render_chat
        from prblib.llm.client import chat_template_of

        messages = [{"role": "user", "content": context}, {"role": "assistant", "content": response}]
        # The submitter's template, rendered as apply_chat_template(messages, tokenize=False) does
        # but in the bounded sandbox (time, steps, output size) judges use: never a hung worker.
        template, special = chat_template_of(self.tokenizer)
        if template is None:
            raise ModelError("the tokenizer's chat template is not a non-empty string")
        return render_chat(template, messages, add_generation_prompt=False, special_tokens=special)

    def _tokenize(self, text: str) -> tuple[int, ...]:
        return tuple(self.tokenizer(text, add_special_tokens=self.add_special_tokens)["input_ids"])

    def _prepare(self, item_id: str, question: str, responses: Sequence[str], *, profile: Sequence[str],
                 plan: Sequence[str], setting: str) -> _Prepared:
        if self.protocol == "release":  # the question alone, as the release gives it
            setting, profile, plan = "no_profile", (), ()
        posts = len(profile[:self.spec.profile_k]) if setting == "profile" else 0
        first_longest = 0
        for keep in range(posts, -1, -1):
            context = render_context(question, setting=setting, profile=profile, plan=plan,
                                     profile_k=self.spec.profile_k, keep_posts=keep)
            texts = tuple(self._render(context, r) for r in responses)
            ids = tuple(self._tokenize(t) for t in texts)
            longest = max(len(i) for i in ids)
            if longest <= self.max_length:
                return _Prepared(texts=texts, ids=ids, truncated_posts=posts - keep)
            first_longest = first_longest or longest
        lengths = ", ".join(str(len(i)) for i in ids)
        raise ModelError(f"pair {item_id!r} does not fit the model's {self.max_length} tokens: {first_longest} "
                         f"tokens as given, {lengths} with no profile posts left; the question and the "
                         "responses are never cut")

    def _score_position(self, ids: Sequence[int]) -> int:
        if self.skip_id is not None:
            for i in range(len(ids) - 1, -1, -1):
                if ids[i] != self.skip_id:
                    return i
        return len(ids) - 1

    def _sample_units(self) -> list[Unit]:
        """Two short prompts of different lengths, for the engine's self-check."""
        samples = [("What should I read next?", ("A novel you can finish in a week.", "Anything.")),
                   ("I moved to a new city and know nobody there. How do I meet people who like board games?",
                    ("Look for a weekly board-game night at a cafe or library.", "Stay home."))]
        units = []
        for key, (question, responses) in enumerate(samples):
            ids = tuple(self._tokenize(self._render(question, r)) for r in responses)
            units.append(Unit(key=key, sequences=ids, positions=tuple(self._score_position(s) for s in ids)))
        return units


def _template_writes_leading_specials(tokenizer: Any, rendered: str) -> bool:
    """Whether the rendered template already starts with the tokens add_special_tokens prepends."""
    plain = tokenizer("x", add_special_tokens=False)["input_ids"]
    full = tokenizer("x", add_special_tokens=True)["input_ids"]
    head = next((full[:k] for k in range(len(full) - len(plain) + 1) if full[k:k + len(plain)] == plain), [])
    if not head:
        return False
    return tokenizer(rendered, add_special_tokens=False)["input_ids"][:len(head)] == head


def _max_length(spec: ModelSpec, config: Any, tokenizer: Any) -> int:
    limits = [spec.max_length]
    positions = getattr(config.get_text_config(), "max_position_embeddings", None)
    if isinstance(positions, int) and positions > 0:
        limits.append(positions)
    tok_limit = getattr(tokenizer, "model_max_length", None)
    if isinstance(tok_limit, int) and 0 < tok_limit < SANE_MAX_LENGTH:
        limits.append(tok_limit)
    return min(limits)
