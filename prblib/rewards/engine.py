"""Batched forward passes for sequence-classification reward models.

The engine gets token ids, never text: a Unit is one prompt's responses (a pair's chosen
and rejected, or a Best-of-N group), each already rendered and tokenized in full. It
yields each unit's scores as soon as the unit is done. Three ways to run a model:

- "prefix" (causal decoders): all responses of a unit share a token prefix (the rendered
  prompt up to where the answer starts). The base model runs it once with use_cache=True;
  the cache rows are then copied for every response, and only the response suffixes run,
  attending to that cache. Prefixes of several units are batched with left padding and
  explicit position ids (cumulative sum of the mask), suffixes with right padding. For a
  pair with a long profile this halves the work; for a group of 16 it saves ~15/16 of the
  prompt.
- "full" (causal decoders, fallback): plain right-padded batches through the base model.
- "logits" (encoders and anything else): right-padded batches through the model itself.

For decoders the engine applies the classification head itself, at the position the
caller gives per sequence, instead of letting transformers guess the last token from the
pad id (which breaks when the pad id also occurs in the text, e.g. pad = eos). All three
ways sort work by length, so batches hold sequences of similar length.

Rotary embeddings that depend on the call's length. transformers recomputes the RoPE
frequencies of some rope types in every forward call from the largest position id in it
(modeling_rope_utils.dynamic_rope_update): "longrope" (Phi-3-128k style: short factors while
the call stays within original_max_position_embeddings, long factors beyond) and any type
containing "dynamic" (NTK scaling once the call passes max_position_embeddings; the module
keeps the grown frequencies until a call shorter than that resets them). A text's score then
depends on what it is run with: a prefix pass alone gets other frequencies than the whole
text, and a short text batched with a long one gets the long one's. For such a model (found
from the rope type in the config's rope_parameters or rope_scaling, flat or per layer type,
and in the rotary modules; see length_dependent_rope) the engine scores every sequence
alone: never "prefix" mode, one sequence per forward in "full" and "logits" mode, and a
"dynamic" rotary module reset to its original frequencies before each call, so each score
is the one a freshly loaded model gives for that text alone. It logs why once, at
construction; check_prefix_mode returns the same sentence and `alone_reason` holds it.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import nn

log = logging.getLogger(__name__)

MODES = ("prefix", "full", "logits")
LONGROPE = "longrope"


@dataclass(frozen=True)
class Unit:
    """One prompt's responses: token ids of each full text, and per text the index of the
    token whose hidden state the head scores (decoders; ignored in "logits" mode)."""

    key: int
    sequences: tuple[tuple[int, ...], ...]
    positions: tuple[int, ...]


class PrefixCacheUnavailable(Exception):
    """The model's cache is not one this engine can copy row by row (sliding or linear layers)."""


def shared_prefix_length(unit: Unit) -> int:
    """Longest common token prefix of a unit's sequences, short enough that every scored
    position lies after it (so each suffix is non-empty and holds its scored token)."""
    first = unit.sequences[0]
    n = min(len(s) for s in unit.sequences)
    for seq in unit.sequences[1:]:
        i = 0
        while i < n and seq[i] == first[i]:
            i += 1
        n = i
    return min(n, min(unit.positions))


def decoder_parts(model: nn.Module) -> tuple[nn.Module, nn.Linear, str | None, bool] | None:
    """(base model, score head, the base forward's cache keyword, accepts position_ids) for a
    causal decoder whose classification logits are head(base(...).last_hidden_state);
    None for encoders and models built otherwise."""
    config = model.config
    if getattr(config, "is_encoder_decoder", False):
        return None
    head = getattr(model, "score", None)
    base = getattr(model, getattr(model, "base_model_prefix", ""), None)
    if not isinstance(head, nn.Linear) or not isinstance(base, nn.Module) or base is model:
        return None
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    if config.model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        return None
    params = inspect.signature(base.forward).parameters
    cache_kw = next((kw for kw in ("cache", "past_key_values") if kw in params), None)
    return base, head, cache_kw, "position_ids" in params


def _rope_types(model: nn.Module) -> list[str]:
    """Every rope type the model names: in its (text) config's rope_parameters (transformers 5)
    or rope_scaling (older), flat or nested per layer type, and on its rotary modules."""
    types: list[str] = []
    config = getattr(model, "config", None)
    configs = [config] if config is not None else []
    get_text_config = getattr(config, "get_text_config", None)
    if callable(get_text_config):
        text_config = get_text_config()
        if text_config is not None and text_config is not config:
            configs.append(text_config)
    for cfg in configs:
        for field in ("rope_parameters", "rope_scaling"):
            params = getattr(cfg, field, None)
            if not isinstance(params, dict):
                continue
            for entry in [params, *(v for v in params.values() if isinstance(v, dict))]:
                kind = entry.get("rope_type", entry.get("type"))
                if isinstance(kind, str):
                    types.append(kind)
    for module in model.modules():
        kind = getattr(module, "rope_type", None)
        if isinstance(kind, str):
            types.append(kind)
        elif isinstance(kind, dict):  # one rotary module for several layer types
            types.extend(v for v in kind.values() if isinstance(v, str))
    return types


def _length_dependent(rope_type: str) -> bool:
    # The rule of transformers' dynamic_rope_update: these two recompute frequencies per call.
    return "dynamic" in rope_type or rope_type == LONGROPE


def length_dependent_rope(model: nn.Module) -> str | None:
    """The first rope type of the model whose frequencies depend on the length of the forward
    call ("longrope", or any type containing "dynamic"), or None."""
    return next((kind for kind in _rope_types(model) if _length_dependent(kind)), None)


def _dynamic_rope_modules(model: nn.Module) -> list[tuple[nn.Module, str | None]]:
    """(rotary module, layer type or None) for every "dynamic" rotary embedding of the model."""
    found = []
    for module in model.modules():
        kind = getattr(module, "rope_type", None)
        if isinstance(kind, str) and "dynamic" in kind:
            found.append((module, None))
        elif isinstance(kind, dict):
            found.extend((module, layer) for layer, v in kind.items() if isinstance(v, str) and "dynamic" in v)
    return found


class ScoringEngine:
    """Scores units in batches of at most `batch_size` sequences per forward pass.

    `label_index` is the logit that is the score; with `negative_index` the score is the
    log-odds logits[label_index] - logits[negative_index] (two-class heads). `softmax_last`
    (protocol "release", a head of two or more labels): the score is the softmax over the labels
    at the last index, computed in the logits' own dtype as the authors' script computes it.

    A model whose rotary embedding depends on the call's length (length_dependent_rope) is
    scored one sequence per forward and never in "prefix" mode; `alone_reason` says why
    (None for every other model).
    """

    def __init__(self, model: nn.Module, *, pad_id: int, batch_size: int, label_index: int = 0,
                 negative_index: int | None = None, mode: str | None = None, softmax_last: bool = False):
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        self.model = model
        self.pad_id = pad_id
        self.batch_size = batch_size
        self.label_index = label_index
        self.negative_index = negative_index
        self.softmax_last = softmax_last
        self.device = next(model.parameters()).device
        parts = decoder_parts(model)
        if parts is not None:
            self.base, self.head, self.cache_kw, self.takes_positions = parts
        else:
            self.base = self.head = self.cache_kw = None
            self.takes_positions = False
        if mode is None:
            mode = "logits" if parts is None else "prefix" if self.cache_kw and self.takes_positions else "full"
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}")
        if mode != "logits" and parts is None:
            raise ValueError(f"mode {mode!r} needs a causal decoder with a score head")
        self.alone_reason: str | None = None
        self._dynamic_rope: list[tuple[nn.Module, str | None]] = []
        rope_type = length_dependent_rope(model)
        if rope_type is not None:
            self.alone_reason = (f"the rotary position embedding ({rope_type!r}) changes with the length of each "
                                 "forward call; scoring every sequence alone (no shared prefix, one sequence "
                                 "per forward pass)")
            log.warning("%s", self.alone_reason)
            self._dynamic_rope = _dynamic_rope_modules(model)
            if mode == "prefix":
                mode = "full"
        self.mode = mode

    @property
    def scores_alone(self) -> bool:
        """Whether every sequence runs alone (a rotary embedding that depends on the call's length)."""
        return self.alone_reason is not None

    @property
    def _per_forward(self) -> int:
        return 1 if self.scores_alone else self.batch_size

    # --- public ------------------------------------------------------------------------

    def score(self, units: Sequence[Unit]) -> Iterator[tuple[int, list[float]]]:
        """Yield (unit key, scores in the unit's sequence order) as units finish; keys must
        be unique.

        Identical sequences of a unit are scored once, so identical responses tie exactly
        (batch position alone can move a float32 score in its last bits). Never holds
        torch's inference mode while suspended at a yield, so the caller's own autograd
        state is left alone."""
        slots: dict[int, list[int]] = {}
        distinct = []
        for unit in units:
            seen: dict[tuple, int] = {}
            for item in zip(unit.sequences, unit.positions):
                seen.setdefault(item, len(seen))
            slots[unit.key] = [seen[item] for item in zip(unit.sequences, unit.positions)]
            distinct.append(Unit(key=unit.key, sequences=tuple(s for s, _ in seen),
                                 positions=tuple(p for _, p in seen)))
        for key, scores in self._score_distinct(distinct):
            yield key, [scores[i] for i in slots[key]]

    def _score_distinct(self, units: Sequence[Unit]) -> Iterator[tuple[int, list[float]]]:
        if self.mode != "prefix":  # never "prefix" when scores_alone: the constructor made it "full"
            yield from self._score_flat(units)
            return
        shared = [shared_prefix_length(u) for u in units]
        cached = [i for i, n in enumerate(shared) if n > 0]
        # Longest first: a batch that does not fit in memory fails at once, not at the end.
        cached.sort(key=lambda i: (shared[i], max(map(len, units[i].sequences))), reverse=True)
        rest = [units[i] for i, n in enumerate(shared) if n == 0]
        for start in range(0, len(cached), self.batch_size):  # up to batch_size prefixes per forward
            batch = [(units[i], shared[i]) for i in cached[start:start + self.batch_size]]
            try:
                with torch.inference_mode():
                    done = self._prefix_batch(batch)
            except PrefixCacheUnavailable as exc:
                log.warning("prefix caching unavailable (%s); scoring every response in full", exc)
                self.mode = "full"
                rest = [units[i] for i in cached[start:]] + rest
                break
            yield from done
        if rest:
            yield from self._score_flat(rest, mode="full")

    def check_prefix_mode(self, units: Sequence[Unit], *, tolerance: float,
                          shipped_pad_id: int | None) -> str | None:
        """Compare the engine's ways on sample units; fall back to a safer mode when they disagree.

        The reference is transformers' own answer for one unpadded sequence, with the pad id
        the model shipped with (a pad id set later for batching must not move the score).
        Returns a sentence saying what was changed (including why every sequence is scored
        alone, see alone_reason), or None when all agreed and nothing was changed."""
        if self.mode == "logits":
            return self.alone_reason
        reference = {}
        config = self.model.config
        batching_pad_id, config.pad_token_id = config.pad_token_id, shipped_pad_id
        try:
            with torch.inference_mode():
                for unit in units:
                    reference[unit.key] = [self._logits_of_one(seq) for seq in unit.sequences]
        finally:
            config.pad_token_id = batching_pad_id

        def agrees(mode: str) -> bool:
            previous, self.mode = self.mode, mode
            try:
                got = dict(self._score_distinct(units))
                if self.mode != mode:  # it fell back on its own
                    return False
            except Exception as exc:  # an architecture that does not take these inputs
                log.warning("scoring mode %r failed its self-check: %r", mode, exc)
                return False
            finally:
                self.mode = previous
            return all(abs(a - b) <= tolerance * (1 + abs(b))
                       for key, ref in reference.items() for a, b in zip(got[key], ref))

        note = None
        if not agrees("full"):
            self.mode = "logits"
            note = "the model's own logits differ from head(base model); scoring through the model's forward"
        elif self.mode == "prefix" and not agrees("prefix"):
            self.mode = "full"
            note = "prefix caching changed the scores for this model; scoring every response in full"
        return "; ".join(n for n in (self.alone_reason, note) if n) or None

    # --- the three ways ----------------------------------------------------------------

    def _prefix_batch(self, batch: list[tuple[Unit, int]]) -> list[tuple[int, list[float]]]:
        dev = self.device
        lengths = torch.tensor([n for _, n in batch], device=dev)
        width = int(lengths.max())
        ids = torch.full((len(batch), width), self.pad_id, dtype=torch.long, device=dev)
        mask = torch.zeros((len(batch), width), dtype=torch.long, device=dev)
        for row, (unit, n) in enumerate(batch):  # right padding: every prefix starts at column 0
            ids[row, :n] = torch.tensor(unit.sequences[0][:n], device=dev)
            mask[row, :n] = 1
        # No attention mask: under the causal mask alone a real token attends only to the real
        # tokens before it (the pads come after), so its output is exact, and attention runs on
        # the causal kernel (no mask tensor: ~20% less CPU than the masked one at ~1,100 tokens).
        # The pads' own cache rows are garbage; the suffix pass masks them out.
        positions = torch.arange(width, device=dev).expand(len(batch), width)
        out = self.base(input_ids=ids, position_ids=positions, use_cache=True)
        layers = _plain_cache_layers(getattr(out, "cache", None) or getattr(out, "past_key_values", None))
        del out

        # (row in the prefix batch, unit index in batch, sequence index, suffix ids, scored offset)
        items = [(row, j, unit.sequences[j][n:], unit.positions[j] - n)
                 for row, (unit, n) in enumerate(batch) for j in range(len(unit.sequences))]
        items.sort(key=lambda it: len(it[2]), reverse=True)
        scores: list[list[float | None]] = [[None] * len(u.sequences) for u, _ in batch]
        from transformers import DynamicCache

        for start in range(0, len(items), self.batch_size):
            chunk = items[start:start + self.batch_size]
            rows = torch.tensor([it[0] for it in chunk], device=dev)
            suffix_ids, suffix_mask = self._right_padded([it[2] for it in chunk])
            cache = DynamicCache([(keys[rows], values[rows]) for keys, values in layers])
            suffix_positions = lengths[rows].unsqueeze(1) + torch.arange(suffix_ids.shape[1], device=dev)
            hidden = self.base(input_ids=suffix_ids, attention_mask=torch.cat([mask[rows], suffix_mask], dim=1),
                               position_ids=suffix_positions, use_cache=True,
                               **{self.cache_kw: cache}).last_hidden_state
            offsets = torch.tensor([it[3] for it in chunk], device=dev)
            values = self._head_scores(hidden[torch.arange(len(chunk), device=dev), offsets])
            for (row, j, _, _), value in zip(chunk, values):
                scores[row][j] = value
        return [(unit.key, s) for (unit, _), s in zip(batch, scores)]

    def _score_flat(self, units: Sequence[Unit], mode: str | None = None) -> Iterator[tuple[int, list[float]]]:
        mode = mode or self.mode
        items = [(u, j) for u in range(len(units)) for j in range(len(units[u].sequences))]
        items.sort(key=lambda it: len(units[it[0]].sequences[it[1]]), reverse=True)
        scores: list[list[float | None]] = [[None] * len(u.sequences) for u in units]
        left = [len(u.sequences) for u in units]
        for start in range(0, len(items), self._per_forward):
            chunk = items[start:start + self._per_forward]
            with torch.inference_mode():
                self._reset_dynamic_rope()
                ids, mask = self._right_padded([units[u].sequences[j] for u, j in chunk])
                if mode == "logits":
                    values = self._logit_scores(self.model(input_ids=ids, attention_mask=mask).logits)
                else:
                    kwargs = {"position_ids": (mask.cumsum(-1) - 1).clamp(min=0)} if self.takes_positions else {}
                    hidden = self.base(input_ids=ids, attention_mask=mask, **kwargs).last_hidden_state
                    at = torch.tensor([units[u].positions[j] for u, j in chunk], device=self.device)
                    values = self._head_scores(hidden[torch.arange(len(chunk), device=self.device), at])
            finished = []
            for (u, j), value in zip(chunk, values):
                scores[u][j] = value
                left[u] -= 1
                if left[u] == 0:
                    finished.append((units[u].key, scores[u]))
            yield from finished

    def _logits_of_one(self, seq: Sequence[int]) -> float:
        ids = torch.tensor([list(seq)], device=self.device)
        self._reset_dynamic_rope()
        return self._logit_scores(self.model(input_ids=ids).logits)[0]

    def _reset_dynamic_rope(self) -> None:
        """Put every "dynamic" rotary embedding back on its original frequencies, as in a freshly
        loaded model: transformers keeps frequencies grown for a long call until a call shorter
        than max_position_embeddings comes, so a text's score would depend on the texts before
        it. One call at position 0 runs transformers' own reset."""
        if not self._dynamic_rope:
            return
        probe = torch.zeros((1, 1, 1), dtype=next(self.model.parameters()).dtype, device=self.device)
        position = torch.zeros((1, 1), dtype=torch.long, device=self.device)
        for module, layer_type in self._dynamic_rope:
            module(probe, position, **({"layer_type": layer_type} if layer_type is not None else {}))

    # --- helpers -----------------------------------------------------------------------

    def _right_padded(self, seqs: Iterable[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        seqs = list(seqs)
        width = max(len(s) for s in seqs)
        ids = torch.full((len(seqs), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(seqs), width), dtype=torch.long)
        for i, s in enumerate(seqs):
            ids[i, :len(s)] = torch.tensor(s, dtype=torch.long)
            mask[i, :len(s)] = 1
        return ids.to(self.device), mask.to(self.device)

    def _head_scores(self, hidden: torch.Tensor) -> list[float]:
        return self._logit_scores(self.head(hidden))

    def _logit_scores(self, logits: torch.Tensor) -> list[float]:
        if self.softmax_last and logits.shape[-1] > 1:
            return torch.softmax(logits, dim=-1)[:, -1].float().tolist()
        logits = logits.float()
        score = logits[:, self.label_index]
        if self.negative_index is not None:
            score = score - logits[:, self.negative_index]
        return score.tolist()


def _plain_cache_layers(cache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(keys, values) per layer of a cache made only of plain full-attention layers."""
    from transformers.cache_utils import DynamicLayer

    layers = getattr(cache, "layers", None)
    if not layers or any(type(layer) is not DynamicLayer or not layer.is_initialized for layer in layers):
        raise PrefixCacheUnavailable(f"cache {type(cache).__name__} is not made of plain dynamic layers")
    return [(layer.keys, layer.values) for layer in layers]
