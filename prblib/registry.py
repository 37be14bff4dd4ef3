"""The one vocabulary of prbench, declared once as data: reward-model kinds, evaluation settings,
protocols (which rules turn outputs into a result), downstream outcome kinds and the Best-of-N k grid.

Every other place that offers or checks one of these names reads it from here: the model
loader (`base.load_reward_model`, which imports a kind's module only when a model of that kind
is loaded), the option schemas (`options.options_model`), the Django choices
(`leaderboard.models.Kind`, `Setting`, `OutcomeKind`), the submission form and the API's
choices and OpenAPI enums, `evaluate_rm --kind/--setting`, the endpoint runtime and the
scoring summary. Every check of what a kind can do (the submission checks, Best-of-N and PPO,
the manifest's prompt keys) asks its entry's flags, never its name. Adding a kind is one
`RMKind` entry in `KINDS` (plus its class, its options model and, when prompted, its prompts
function); see docs/architecture.md, "Adding a reward-model kind".

Plain Python: no Django and no model code is imported here (a kind's class is named by its
import path and imported on first use).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Literal

from prblib.errors import ModelError

# How many ranked past posts make a profile when a kind's options do not say (the paper's k).
DEFAULT_PROFILE_K = 10

# What a kind needs to run: a model folder under the models root, an LLM (a staff endpoint or
# a local causal-LM folder), or an uploaded scores file.
Need = Literal["model_folder", "llm", "scores_file"]
# Where a kind's calibration comes from: the chosen-minus-rejected score differences, or the
# share of its verdicts that prefer the chosen answer (`pipeline.services.verdict_share`).
Calibration = Literal["score_difference", "verdict_share"]


@dataclass(frozen=True)
class RMKind:
    """One reward-model kind.

    name         the stored value (Submission.kind, `--kind`, the API's `kind`)
    label        the human label (form, tables, admin)
    implementation  "module:Class"; the class has `load(spec)` and meets `base.RewardModel`
    options      the name of its options model in `prblib.rewards.options`
    needs        what a submission must provide (see Need)
    model_task   the folder check's task for a model folder ("sequence-classification" or
                 "causal-lm"); None when the kind takes no folder
    scores_groups   the class scores Best-of-N groups itself (`score_groups`); otherwise samples
                 are scored against a reference answer with `score_pairs`
    reports_usage   `usage()` returns the backend's requests, tokens and cost (else None)
    calibration  see Calibration
    chain_scaling   results carry sampled chains: the summary adds the (m, n) scaling grid
    single_setting  a submission runs in exactly one setting (an uploaded file was computed in one)
    scores_new_answers  the model can score answers it has not seen (Best-of-N samples, PPO
                 rollouts); False for scores computed elsewhere on the benchmark's own pairs
    prompts      "module:function" giving {role: "name@vN"} of the prompt templates the kind
                 sends, called as f(options dict, template_file=None) (the manifest's
                 "templates"); None for kinds that send no prompt
    template_file   an operator may replace the kind's prompt with a template file
                 (`evaluate_rm --template-file`, runtime["pgenrm_template"])
    settings     the settings the kind supports (all of SETTINGS by default)
    protocols    ((protocol name, one-line definition for this kind), ...): the protocols its options
                 offer (`options.protocol`, see PROTOCOLS); () for a kind that has only our rules
    released_settings  the settings in which the authors' released scripts evaluate this kind, so a
                 result there has a published counterpart; () when the release has no script for the
                 kind; None when the question does not arise (uploaded scores, P-GenRM's own release)
    rm_type      the paper's group of a result of this kind without a model preset ("scalar",
                 "generative", "fine_tuned", "other"; `presets.RM_TYPES`); a preset names its own

    A kind's options model (`options`) also declares the data-folder files its options name
    (`data_files()`: the submission check refuses a missing one), so no check names a kind.
    """

    name: str
    label: str
    implementation: str
    options: str
    needs: frozenset[str]
    model_task: str | None = None
    scores_groups: bool = False
    reports_usage: bool = False
    calibration: str = "score_difference"
    chain_scaling: bool = False
    single_setting: bool = False
    scores_new_answers: bool = True
    prompts: str | None = None
    template_file: bool = False
    settings: tuple[str, ...] | None = None
    protocols: tuple[tuple[str, str], ...] = ()
    released_settings: tuple[str, ...] | None = None
    rm_type: str = "other"

    @property
    def generative(self) -> bool:
        """Runs an LLM (a staff endpoint may serve it; its answers are cached)."""
        return "llm" in self.needs

    def supports(self, setting: str) -> bool:
        return setting in (self.settings if self.settings is not None else setting_names())

    def protocol_definition(self, name: str) -> str:
        """The one-line definition of protocol `name` for this kind ("" when it does not offer it)."""
        return dict(self.protocols).get(name, "")

    def load_class(self) -> Any:
        """Import the implementing class (its module, and torch with it, only now)."""
        module_name, _, class_name = self.implementation.partition(":")
        return getattr(importlib.import_module(module_name), class_name)

    def prompt_versions(self, options: dict[str, Any] | None = None, *,
                        template_file: str | None = None) -> dict[str, str]:
        """{role: "name@vN"} of the prompts this kind sends with `options` ({} when `prompts` is None);
        the function's module is imported only now."""
        if self.prompts is None:
            return {}
        module_name, _, function_name = self.prompts.partition(":")
        function = getattr(importlib.import_module(module_name), function_name)
        return function(dict(options or {}), template_file=template_file)


@dataclass(frozen=True)
class SettingInfo:
    """One evaluation setting: what the model sees beside the question.

    needs: an item field every pair must have for the setting ("plan": planner aspects), or None.
    """

    name: str
    label: str
    needs: str | None = None
    needs_hint: str = ""


@dataclass(frozen=True)
class OutcomeKindInfo:
    """A downstream outcome: how a policy did with a reward model. `per_k` outcomes are Best-of-k.
    `run_options`: the options model (a class name in prblib.rewards.options) of the runs we execute
    for this kind; None for kinds only imported."""

    name: str
    label: str
    per_k: bool = False
    run_options: str | None = None


@dataclass(frozen=True)
class ProtocolInfo:
    """A named set of rules that turns a model's outputs into a result (docs/protocols.md).

    name: the stored value (`options.protocol`); label: the short label shown beside a number;
    description: what the name stands for, whatever the kind."""

    name: str
    label: str
    description: str


PROTOCOLS: tuple[ProtocolInfo, ...] = (
    ProtocolInfo("prbench", "prbench", "this platform's rules (docs/protocols.md says what they are and why)"),
    ProtocolInfo("release", "release", "what the authors' released evaluation scripts compute"),
)
DEFAULT_PROTOCOL = "prbench"

# One-line definitions per kind, shown beside every number of that kind.
_PAIRWISE_PROTOCOLS = (
    ("prbench", "Both orders judged; a pair counts only when the chosen answer wins both (a 1-1 split or an "
                "unreadable verdict is wrong)."),
    ("release", "One order per pair, drawn as the authors' script draws it (seed 42, per domain in row order); "
                "the judge sees only the question and the two answers; an unreadable verdict counts as A."),
)
_SCALAR_PROTOCOLS = (
    ("prbench", "The setting's context (question, with posts or plan) and the answer as one chat turn; a "
                "two-label head read as the log-odds of the label whose name reads positive."),
    ("release", "The question and the answer as one chat turn, no profile; a two-label head read as the "
                "softmax of its last label, as the authors' script reads it."),
)

KINDS: tuple[RMKind, ...] = (
    RMKind("scalar", "Scalar (sequence classification)", "prblib.rewards.scalar:ScalarRewardModel",
           "ScalarOptions", frozenset({"model_folder"}), model_task="sequence-classification",
           scores_groups=True, protocols=_SCALAR_PROTOCOLS, released_settings=("no_profile",), rm_type="scalar"),
    RMKind("pairwise", "Generative judge, pairwise", "prblib.rewards.judges:PairwiseJudge",
           "PairwiseOptions", frozenset({"llm"}), model_task="causal-lm", reports_usage=True,
           calibration="verdict_share", prompts="prblib.rewards.judges:pairwise_prompts",
           protocols=_PAIRWISE_PROTOCOLS, released_settings=("no_profile",), rm_type="generative"),
    RMKind("pointwise", "Generative judge, pointwise", "prblib.rewards.judges:PointwiseJudge",
           "PointwiseOptions", frozenset({"llm"}), model_task="causal-lm", reports_usage=True,
           prompts="prblib.rewards.judges:pointwise_prompts", released_settings=(), rm_type="generative"),
    RMKind("scores", "Uploaded scores", "prblib.rewards.scores:UploadedScores",
           "ScoresOptions", frozenset({"scores_file"}), single_setting=True, scores_new_answers=False),
    RMKind("pgenrm", "P-GenRM personalised judge", "prblib.rewards.pgenrm.model:PGenRM",
           "PGenRMOptions", frozenset({"llm"}), model_task="causal-lm", reports_usage=True,
           calibration="verdict_share", chain_scaling=True,
           prompts="prblib.rewards.pgenrm.model:chain_prompts", template_file=True, rm_type="fine_tuned"),
    RMKind("dpo", "DPO implicit reward (policy vs reference)", "prblib.rewards.dpo:DPORewardModel",
           "DPOOptions", frozenset({"model_folder"}), model_task="causal-lm", scores_groups=True,
           released_settings=()),
)

SETTINGS: tuple[SettingInfo, ...] = (
    SettingInfo("no_profile", "Without profile"),
    SettingInfo("profile", "With profile"),
    SettingInfo("plan", "With plan", needs="plan",
                needs_hint="every pair needs planner aspects; make a planned version first with "
                           "manage.py plan_benchmark --benchmark NAME --planner ENDPOINT --planner-model MODEL "
                           "--name NEW."),
)

OUTCOME_KINDS: tuple[OutcomeKindInfo, ...] = (
    OutcomeKindInfo("best_of_n", "Best-of-N", per_k=True, run_options="BestOfNOptions"),
    OutcomeKindInfo("ppo", "PPO", run_options="PPOOptions"),
    OutcomeKindInfo("grpo", "GRPO"),
    OutcomeKindInfo("rloo", "RLOO"),
)

N_SAMPLES = 16  # Best-of-N samples per item by default


class UnknownName(ValueError):
    """A kind, setting or outcome kind that is not in the registry; the message lists the known ones."""


def kind(name: str) -> RMKind:
    """The entry of kind `name`; UnknownName naming the known kinds."""
    for entry in KINDS:
        if entry.name == name:
            return entry
    raise UnknownName(f"unknown reward-model kind {name!r} (known: {', '.join(kind_names())})")


def kind_names(*, needs: str | None = None) -> tuple[str, ...]:
    """Every kind's name in registry order; with `needs`, only the kinds that need it."""
    return tuple(k.name for k in KINDS if needs is None or needs in k.needs)


def kind_choices() -> list[tuple[str, str]]:
    """[(name, label)] for forms, API choices and filters."""
    return [(k.name, k.label) for k in KINDS]


def generative_kind_names() -> tuple[str, ...]:
    return kind_names(needs="llm")


def template_file_kind_names() -> tuple[str, ...]:
    """The kinds whose prompt an operator may replace with a template file."""
    return tuple(k.name for k in KINDS if k.template_file)


def protocol(name: str) -> ProtocolInfo:
    for entry in PROTOCOLS:
        if entry.name == name:
            return entry
    raise UnknownName(f"unknown protocol {name!r} (known: {', '.join(p.name for p in PROTOCOLS)})")


def protocol_of(kind_name: str, options: dict[str, Any] | None) -> str:
    """The protocol a result of `kind_name` with these (stored) options follows: options["protocol"]
    for a kind that offers protocols, DEFAULT_PROTOCOL otherwise (and when unset)."""
    value = (options or {}).get("protocol") if kind(kind_name).protocols else None
    return value if isinstance(value, str) and value else DEFAULT_PROTOCOL


def protocol_display(kind_name: str, options: dict[str, Any] | None) -> dict[str, str]:
    """{name, label, definition} of the protocol a result follows, for pages, tables and exports;
    the definition is the kind's own line, or the protocol's description for a kind without one."""
    name = protocol_of(kind_name, options)
    info = protocol(name)
    return {"name": name, "label": info.label, "definition": kind(kind_name).protocol_definition(name)
            or info.description}


def setting(name: str) -> SettingInfo:
    for entry in SETTINGS:
        if entry.name == name:
            return entry
    raise UnknownName(f"unknown setting {name!r} (known: {', '.join(setting_names())})")


def setting_info(name: str) -> SettingInfo:
    """The registry's entry for setting `name`; ModelError (for a model's caller, naming the
    known settings) where `setting` raises UnknownName."""
    try:
        return setting(name)
    except UnknownName as exc:
        raise ModelError(str(exc)) from None


def setting_names() -> tuple[str, ...]:
    return tuple(s.name for s in SETTINGS)


def setting_choices() -> list[tuple[str, str]]:
    return [(s.name, s.label) for s in SETTINGS]


def outcome_kind(name: str) -> OutcomeKindInfo:
    for entry in OUTCOME_KINDS:
        if entry.name == name:
            return entry
    raise UnknownName(f"unknown outcome kind {name!r} (known: {', '.join(outcome_kind_names())})")


def outcome_kind_names() -> tuple[str, ...]:
    return tuple(o.name for o in OUTCOME_KINDS)


def outcome_kind_choices() -> list[tuple[str, str]]:
    return [(o.name, o.label) for o in OUTCOME_KINDS]


def k_grid(n: int) -> tuple[int, ...]:
    """The Best-of-k values reported for N samples: the powers of two below N, then N itself, so
    every sample generated is used (N = 16: 1, 2, 4, 8, 16; N = 12: 1, 2, 4, 8, 12; N = 1: 1).
    ValueError for an N that is not an integer >= 1."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"N must be an integer >= 1, not {n!r}")
    ks = []
    k = 1
    while k < n:
        ks.append(k)
        k *= 2
    return tuple(ks) + (n,)


KS = k_grid(N_SAMPLES)  # the default grid, (1, 2, 4, 8, 16)
