"""The reward-model interface shared by every RM kind, and its lazy registry.

Plain Python: no Django imports here or anywhere in prblib/. The web process never
imports torch; a kind's module (and torch with it) is imported only when a model of that
kind is loaded, on a worker or in `evaluate_rm`.

What a reward model sees is an ItemView (a PairInput or a ScoreInput). It has no narrative and
no rubric aspects: those are the answer key, and they are kept out structurally (the type has
no field for them), not by convention. The kinds, settings and their names are data in
`prblib.registry`; how a profile becomes prompt text is `prblib.context`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from prblib import registry
from prblib.errors import ModelError
from prblib.registry import DEFAULT_PROFILE_K, setting_info

@dataclass(frozen=True, kw_only=True)
class ItemView:
    """One benchmark item as any model may see it: the question and what is known about the
    person. There is deliberately no narrative or rubric field (the answer key is kept out by
    the type, not by convention). PairInput and ScoreInput add the responses to score;
    `bon.PolicyItem` and `generation.GenerationRequest` are built from the same fields."""

    id: str
    question: str
    profile: tuple[str, ...] = ()  # past posts' texts, most relevant first
    plan: tuple[str, ...] = ()  # planner aspects for the `plan` setting


@dataclass(frozen=True, kw_only=True)
class PairInput(ItemView):
    """One benchmark pair as a reward model may see it."""

    domain: str
    chosen: str
    rejected: str
    # Pair-history benchmarks: the user's earlier preferences [{prompt, chosen, rejected}]
    # (also rendered into `profile` as text, so every kind sees them in the profile setting).
    history: tuple[dict, ...] = ()
    # The user who asked, when the benchmark names users (pair-history data): P-GenRM never takes
    # this user as one of their own "similar users".
    user_id: str = ""
    # The pair's 0-based row among its domain's pairs in the benchmark's order (what the authors'
    # release iterates per subset file); None when the caller does not know it. Protocol
    # "release" orders a judge's answers by it (prblib.rewards.protocols).
    row_in_domain: int | None = None


@dataclass(frozen=True, kw_only=True)
class ScoreInput(ItemView):
    """One prompt with several responses to score (Best-of-N groups use this too)."""

    responses: tuple[str, ...]


@dataclass
class PairResult:
    """Scores for one pair. `correct` follows the paper's rule: chosen must score strictly
    higher, so a tie counts as wrong. A score is None when the model gave no usable answer
    (a judge's parse failure): such a pair is wrong, never defaulted to a side."""

    id: str
    chosen_score: float | None
    rejected_score: float | None
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def correct(self) -> bool:
        return (self.chosen_score is not None and self.rejected_score is not None
                and self.chosen_score > self.rejected_score)

    @property
    def tie(self) -> bool:
        return (self.chosen_score is not None and self.rejected_score is not None
                and self.chosen_score == self.rejected_score)


@dataclass(frozen=True)
class ModelSpec:
    """How to load and run one reward model."""

    kind: str
    path: str  # a model folder, an uploaded scores file, or an endpoint's model name
    device: str = "cpu"  # "cpu" or "cuda"
    dtype: str = "auto"  # auto: float32 on CPU, bfloat16 on CUDA
    max_length: int = 4096
    batch_size: int = 8
    profile_k: int = DEFAULT_PROFILE_K
    # What the submitter chose: checked against the kind's schema (prblib.rewards.options).
    options: dict[str, Any] = field(default_factory=dict)
    # What the platform or an operator decides, never a submission: the backend connection
    # from a staff-configured endpoint (llm.BACKEND_OPTIONS keys), cache folder and key, the
    # roots every file must resolve inside (models_root, data_root), the benchmark's ids.
    runtime: dict[str, Any] = field(default_factory=dict)


ProgressFn = Callable[[int], None]  # called with the number of pairs finished since the last call


class RewardModel(Protocol):
    """What every reward-model kind implements (its class is named in `registry.KINDS`).

    `scores_groups` declares the optional `score_groups` capability (scalar RMs: each Best-of-N
    group scored at once, its shared prompt computed once); it matches the registry entry's
    flag. A kind without it has its Best-of-N samples scored against a reference answer with
    `score_pairs`."""

    kind: ClassVar[str]
    scores_groups: ClassVar[bool]

    @classmethod
    def load(cls, spec: ModelSpec) -> RewardModel:
        """Build the model from its spec; ModelError for anything the submitter can fix."""

    def score_pairs(self, pairs: Sequence[PairInput], *, setting: str,
                    progress: ProgressFn | None = None) -> Iterator[PairResult]:
        """Yield one PairResult per pair, in any order, as they finish."""

    def score_groups(self, groups: Sequence[ScoreInput], *, setting: str,
                     progress: ProgressFn | None = None) -> Iterator[tuple[str, list[float]]]:
        """Only when `scores_groups`: yield (group id, one score per response) per group."""

    def render_inputs(self, pair: PairInput, *, setting: str) -> tuple[str, str]:
        """The exact texts the model is given for (chosen, rejected), for --dump-inputs."""

    def usage(self) -> dict[str, Any] | None:
        """What the model's backends were asked for so far: {requests, prompt_tokens,
        completion_tokens, cost (None when the endpoint has no prices), cache_hits,
        cache_misses, ...}; None for kinds that call no LLM (registry flag `reports_usage`)."""

    def reusable(self) -> bool:
        """Whether a later job may use this loaded model again: False once it was closed, or (LLM
        judges) once a backend of theirs was cancelled by a time limit or a cancel and would
        refuse every request. The worker then loads a fresh one (`pipeline.inputs.reward_model_get`)."""

    def close(self) -> None:
        """Free memory (GPU) and connections held by the model; safe to call twice."""


def load_reward_model(spec: ModelSpec) -> RewardModel:
    """Import the kind's module on first use (`registry.KINDS` names its class) and build the model."""
    try:
        entry = registry.kind(spec.kind)
    except registry.UnknownName as exc:
        raise ModelError(str(exc)) from None
    try:
        cls = entry.load_class()
    except ModuleNotFoundError as exc:
        if exc.name == entry.implementation.partition(":")[0]:
            raise ModelError(f"reward-model kind {spec.kind!r} is not available in this version") from None
        raise
    return cls.load(spec)


def check_setting(setting: str, pair: ItemView) -> None:
    """ModelError when `setting` is unknown, or when the item lacks what the setting needs
    (`plan`: planner aspects)."""
    info = setting_info(setting)
    if info.needs == "plan" and not pair.plan:
        raise ModelError(f"setting 'plan' needs planner aspects, and pair {pair.id!r} has none "
                         "(run the planner on this benchmark first)")
