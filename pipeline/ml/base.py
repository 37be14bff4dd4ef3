"""The reward-model interface shared by every RM kind, and its lazy registry.

Plain Python: no Django imports here or anywhere in pipeline/ml. The web process never
imports torch; a kind's module (and torch with it) is imported only when a model of that
kind is loaded, on a worker or in `evaluate_rm`.

What a reward model sees is a PairInput. It has no narrative and no rubric aspects: those
are the answer key, and they are kept out structurally (the type has no field for them),
not by convention.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

KINDS = ("scalar", "pairwise", "pointwise", "scores", "pgenrm")
SETTINGS = ("no_profile", "profile", "plan")
DEFAULT_PROFILE_K = 10


class ModelError(Exception):
    """A model that cannot be loaded or run; the message is shown to the submitter."""


@dataclass(frozen=True)
class PairInput:
    """One benchmark pair as a reward model may see it."""

    id: str
    domain: str
    question: str
    chosen: str
    rejected: str
    profile: tuple[str, ...] = ()  # past posts' texts, most relevant first
    plan: tuple[str, ...] = ()  # planner aspects for the `plan` setting
    # Pair-history benchmarks: the user's earlier preferences [{prompt, chosen, rejected}]
    # (also rendered into `profile` as text, so every kind sees them in the profile setting).
    history: tuple[dict, ...] = ()
    # The user who asked, when the benchmark names users (pair-history data): P-GenRM never takes
    # this user as one of their own "similar users".
    user_id: str = ""


@dataclass(frozen=True)
class ScoreInput:
    """One prompt with several responses to score (Best-of-N groups use this too)."""

    id: str
    question: str
    responses: tuple[str, ...]
    profile: tuple[str, ...] = ()
    plan: tuple[str, ...] = ()


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
    # What the submitter chose: checked against the kind's schema (pipeline.ml.options).
    options: dict[str, Any] = field(default_factory=dict)
    # What the platform or an operator decides, never a submission: the backend connection
    # from a staff-configured endpoint (llm.BACKEND_OPTIONS keys), cache folder and key, the
    # roots every file must resolve inside (models_root, data_root), the benchmark's ids.
    runtime: dict[str, Any] = field(default_factory=dict)


ProgressFn = Callable[[int], None]  # called with the number of pairs finished since the last call


class RewardModel(Protocol):
    kind: str

    def score_pairs(self, pairs: Sequence[PairInput], *, setting: str,
                    progress: ProgressFn | None = None) -> Iterator[PairResult]:
        """Yield one PairResult per pair, in any order, as they finish."""

    def render_inputs(self, pair: PairInput, *, setting: str) -> tuple[str, str]:
        """The exact texts the model is given for (chosen, rejected), for --dump-inputs."""

    def close(self) -> None:
        """Free memory (GPU) held by the model."""


REGISTRY: dict[str, str] = {
    "scalar": "pipeline.ml.scalar:ScalarRewardModel",
    "pairwise": "pipeline.ml.judges:PairwiseJudge",
    "pointwise": "pipeline.ml.judges:PointwiseJudge",
    "scores": "pipeline.ml.scores:UploadedScores",
    "pgenrm": "pipeline.ml.pgenrm:PGenRM",
}


def load_reward_model(spec: ModelSpec) -> RewardModel:
    """Import the kind's module on first use and build the model."""
    if spec.kind not in REGISTRY:
        raise ModelError(f"unknown reward-model kind {spec.kind!r} (known: {', '.join(REGISTRY)})")
    module_name, _, class_name = REGISTRY[spec.kind].partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name == module_name:
            raise ModelError(f"reward-model kind {spec.kind!r} is not available in this version") from None
        raise
    return getattr(module, class_name).load(spec)


def check_setting(setting: str, pair: PairInput | ScoreInput) -> None:
    if setting not in SETTINGS:
        raise ModelError(f"unknown setting {setting!r} (known: {', '.join(SETTINGS)})")
    if setting == "plan" and not pair.plan:
        raise ModelError(f"setting 'plan' needs planner aspects, and pair {pair.id!r} has none "
                         "(run the planner on this benchmark first)")


def render_context(question: str, *, setting: str, profile: Sequence[str] = (), plan: Sequence[str] = (),
                   profile_k: int = DEFAULT_PROFILE_K, keep_posts: int | None = None) -> str:
    """The user-turn text a model sees before a response.

    no_profile: the question alone. profile: the question after the top-k past posts,
    most relevant first. plan: the question after the planner's aspects.
    `keep_posts` drops the lowest-ranked posts (when a scalar RM's context is too long);
    the question itself is never cut.
    """
    if setting == "no_profile":
        return question
    if setting == "profile":
        posts = list(profile[:profile_k])
        if keep_posts is not None:
            posts = posts[:keep_posts]
        if not posts:
            return question
        lines = "\n".join(f"{i}. {text.strip()}" for i, text in enumerate(posts, start=1))
        return f"Past posts by the person asking (most relevant first):\n{lines}\n\nQuestion: {question}"
    if setting == "plan":
        lines = "\n".join(f"- {aspect.strip()}" for aspect in plan)
        return f"What this person is likely to value in an answer:\n{lines}\n\nQuestion: {question}"
    raise ModelError(f"unknown setting {setting!r} (known: {', '.join(SETTINGS)})")
