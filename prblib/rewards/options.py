"""What a researcher may set for each reward-model kind: one typed schema per kind.

A submission's `options` (the form, `POST /api/submissions/`, `evaluate_rm --option`) are
data, never configuration of the worker. Each kind declares its options here, with types,
bounds, defaults and a description; anything else is refused with the key named. Connection
settings (backend, base URL, API-key variable, timeouts, concurrency, prices), cache folders,
model roots and benchmark ids never come from options: the platform puts them in
`ModelSpec.runtime` from staff-configured endpoints (`LLMEndpoint`) and its own settings.

Plain Python and pydantic; no Django, no torch (the web process validates with this).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import PurePosixPath
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from prblib.rewards import presets
from prblib.rewards import reasoning
from prblib import registry
from prblib.rewards.protocols import RELEASE_BEST_OF_N, RELEASE_PPO
from prblib.errors import ModelError
from prblib.rows import type_name


class OptionsError(ModelError):
    """Options refused; `key` names the offending option ("" when the whole value is wrong)."""

    def __init__(self, message: str, *, key: str = ""):
        super().__init__(message)
        self.key = key


class _Options(BaseModel):
    # strict: "4" is not 4 and true is not 1; extra: anything undeclared is an error.
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    def data_files(self) -> dict[str, tuple[str | None, str]]:
        """{option key: (the file it names relative to the data folder, or None when the options
        need one and none is given; the sentence that says what is needed)} for every data-folder
        file these options need. The submission check refuses each one missing, naming the key.
        {} by default: most kinds name no data file."""
        return {}

    def setting_refusal(self, setting: str) -> str | None:
        """The sentence refusing to run these options in `setting`, or None when they can (the
        submission check and the model both ask). None by default."""
        return None

    def model_folders(self) -> dict[str, tuple[str | None, str, str]]:
        """{option key: (the model folder it names relative to the models folder, or None when the
        options need one and none is given; the folder check's task, "causal-lm" or
        "sequence-classification"; the sentence that says what is needed)} for every model folder
        these options name besides the submission's own (a DPO model's reference). The submission
        check refuses each one missing or refused by the folder check, and the weights hash covers
        them. {} by default."""
        return {}

    def fingerprint_extra(self) -> str:
        """What, besides the weights, kind, benchmark and protocol, makes a result of these options
        a different result ("" by default): it is appended to the run's fingerprint."""
        return ""

    def requests_per_pair(self) -> int:
        """LLM requests a generative RM with these options sends per pair, before retries (the
        spend estimate, pipeline/endpoints.py): 2 by default (a pointwise judge: one per answer)."""
        return 2

    def answer_budget(self) -> int:
        """Most completion tokens one of those requests may use: `max_tokens`, 512 without one."""
        return int(getattr(self, "max_tokens", 512))


ProtocolName = Literal["prbench", "release"]
PROTOCOL_DESCRIPTION = ("prbench: this platform's rules (the default); release: what the authors' released "
                        "script computes, for numbers to put beside the paper's (docs/protocols.md).")
RELEASE_SETTING = "no_profile"


def release_setting_refusal(protocol: str, setting: str) -> str | None:
    """Protocol 'release' runs only where the release has a counterpart: the question alone."""
    if protocol == "release" and setting != RELEASE_SETTING:
        return (f"protocol 'release' shows the model only the question, as the authors' scripts do (they have no "
                f"profile or plan evaluation): run it in the {RELEASE_SETTING} setting, not {setting}")
    return None


MODEL_PRESET_DESCRIPTION = ("The model preset these options came from (prblib/rewards/presets.py; set by choosing "
                            "`preset`, not by hand): recorded with the result.")


def _preset_of_kind(value: str | None, kind: str) -> str | None:
    """`value` when it names a preset of `kind` (None passes); ValueError otherwise."""
    if value is None:
        return None
    try:
        entry = presets.preset(value)
    except presets.UnknownPreset as exc:
        raise ValueError(str(exc)) from None
    if entry.kind != kind:
        raise ValueError(f"preset {value!r} runs as the {entry.kind} kind, not {kind}")
    return value


def _data_relative(value: str | None) -> str | None:
    """A file name relative to the data folder, without '..' (None and "" give None)."""
    if value is None or value == "":
        return None
    path = PurePosixPath(value.replace("\\", "/"))
    if path.is_absolute() or ".." in path.parts or "\x00" in value:
        raise ValueError("must be a file name relative to the data folder, without '..'")
    return value


def _model_preset_field() -> Any:
    return Field(None, max_length=60, description=MODEL_PRESET_DESCRIPTION)


class _PresetOption(_Options):
    """Options with a `model_preset` (declared last by each kind's model, so it is listed last)."""

    @field_validator("model_preset", check_fields=False)
    @classmethod
    def _preset_fits(cls, value: str | None) -> str | None:
        return _preset_of_kind(value, _OPTIONS_KIND[cls.__name__])


class ScalarOptions(_PresetOption):
    prefix_cache: bool = Field(True, description="Compute a pair's shared prompt prefix once (decoders); "
                                                 "false scores every response with a full forward pass.")
    protocol: ProtocolName = Field("prbench", description=PROTOCOL_DESCRIPTION)
    model_preset: str | None = _model_preset_field()

    def setting_refusal(self, setting: str) -> str | None:
        return release_setting_refusal(self.protocol, setting)


class ScoresOptions(_Options):
    """Uploaded scores have no options: the file is the model."""


class _JudgeOptions(_Options):
    temperature: float = Field(0.0, ge=0, le=2, description="Sampling temperature; 0 judges deterministically.")
    max_tokens: int = Field(512, ge=1, le=32768, description="Room for brief reasoning before the final line.")
    seed: int | None = Field(0, ge=0, le=2 ** 31 - 1, description="Sent to the endpoint (local: seeds sampling); "
                                                                  "null for none.")


class _ReasoningOptions(_JudgeOptions, _PresetOption):
    """The judges' prompt format, answer parser and operator template (prblib.rewards.reasoning)."""

    prompt_template: str | None = Field(None, max_length=300, description=(
        "An operator's template file ({\"system\", \"user\", \"syntax\"} JSON) named relative to the data folder, "
        "replacing the prompt format's words (its answer parser stays)."))

    def data_files(self) -> dict[str, tuple[str | None, str]]:
        if self.prompt_template:
            return {"prompt_template": (self.prompt_template, f"prompt_template {self.prompt_template!r} is not a file "
                                                              "in the data folder (an operator places template "
                                                              "files there).")}
        return {}

    @field_validator("prompt_template")
    @classmethod
    def _relative_template(cls, value: str | None) -> str | None:
        return _data_relative(value)


class PairwiseOptions(_ReasoningOptions):
    prompt_format: Literal["prbench", "rm-r1", "rm-r1-reasoning", "r3"] = Field(
        "prbench", description="prbench: our prompt and \"Verdict:\" line; rm-r1 / rm-r1-reasoning: RM-R1's rubric "
                               "then <answer>[[A]]</answer>; r3: R3's sections and JSON {explanation, score}.")
    answer_parser: Literal["verdict_line", "rm_r1", "r3_json"] | None = Field(
        None, description="How the verdict is read; default: the prompt format's own.")
    both_orders: bool = Field(True, description="Judge each pair twice: chosen shown first, then second "
                                                "(protocol release judges one order, as released).")
    protocol: ProtocolName = Field("prbench", description=PROTOCOL_DESCRIPTION)
    model_preset: str | None = _model_preset_field()

    def setting_refusal(self, setting: str) -> str | None:
        return release_setting_refusal(self.protocol, setting)

    @model_validator(mode="after")
    def _release_has_its_own_prompt(self):
        if self.protocol == "release" and (self.prompt_format != "prbench" or self.answer_parser or
                                           self.prompt_template):
            raise ValueError("protocol 'release' sends the release's own prompt and reads its reply its own way: "
                             "prompt_format, answer_parser and prompt_template do not go with it")
        return self

    @model_validator(mode="after")
    def _one_order_when_released(self):
        if self.protocol == "release" and "both_orders" in self.model_fields_set and self.both_orders:
            raise ValueError("both_orders true does not go with protocol 'release', which judges one order per "
                             "pair as the authors' script does: leave both_orders unset (or false)")
        return self

    def requests_per_pair(self) -> int:
        """Both orders (2), or one under protocol release or both_orders false."""
        return 1 if self.protocol == "release" or not self.both_orders else 2


class PointwiseOptions(_ReasoningOptions):
    prompt_format: Literal["prbench", "r3", "r3-binary"] = Field(
        "prbench", description="prbench: our 1-10 prompt and \"Score:\" line; r3: R3's 1-5 rubric and JSON score; "
                               "r3-binary: R3's binary task format (score true or false, read as 1 or 0).")
    answer_parser: Literal["score_line", "r3_json", "r3_binary"] | None = Field(
        None, description="How the score is read; default: the prompt format's own.")
    model_preset: str | None = _model_preset_field()


def _relative_folder(value: str | None, what: str = "the models folder") -> str | None:
    """A name relative to a root folder ("" and None: none); ValueError for an absolute one or '..'."""
    if value is None or value == "":
        return None
    path = PurePosixPath(value.replace("\\", "/"))
    if path.is_absolute() or ".." in path.parts or "\x00" in value:
        raise ValueError(f"must be a folder name relative to {what}, without '..'")
    return value


class DPOOptions(_Options):
    """A DPO policy scored as an implicit reward model (`prblib.rewards.dpo`): reward = beta x the sum over
    the answer's tokens of log pi_policy - log pi_reference (RewardBench's definition)."""

    reference: str | None = Field(None, max_length=300, description=(
        "The reference model's folder (the model the policy was trained from), relative to the models folder; "
        "required unless reference_free."))
    reference_free: bool = Field(False, description="No reference model: the reward is the policy's log-probability "
                                                    "of the answer alone, reduced by reference_free_norm.")
    reference_free_norm: Literal["avg", "sum", "norm"] = Field("avg", description=(
        "Reference-free only (RewardBench's ref_free_type): avg, the mean log-probability per answer token "
        "(length-normalised; RewardBench's default); sum, the total; norm, minus the L2 norm of the per-token "
        "log-probabilities."))
    beta: float = Field(1.0, gt=0, le=1000, description="Multiplies the reward (DPO's beta; RewardBench reports 1); "
                                                        "it never changes which answer wins.")

    @field_validator("reference")
    @classmethod
    def _relative_name(cls, value: str | None) -> str | None:
        return _relative_folder(value)

    @model_validator(mode="after")
    def _reference_or_free(self):
        if self.reference_free and self.reference:
            raise ValueError("reference_free needs no reference: give one or the other")
        if not self.reference_free and "reference_free_norm" in self.model_fields_set:
            raise ValueError("reference_free_norm applies only with reference_free true")
        return self

    def model_folders(self) -> dict[str, tuple[str | None, str, str]]:
        if self.reference_free:
            return {}
        return {"reference": (self.reference, "causal-lm", "The dpo kind needs 'reference': the reference model's "
                              "folder relative to the models folder (or reference_free true).")}

    def fingerprint_extra(self) -> str:
        return f"reference-free:{self.reference_free_norm}" if self.reference_free else ""


# The paper's and the release's test-time scaling: 16 own chains + 8 neighbours, sampled at temperature 1.
# The release sends no max_tokens (vLLM then allows the rest of the context); 8192 leaves a chain of the
# released format room (a chain cut by the limit is a failure; see README, "P-GenRM as published").
PAPER_PRESET = {"m": 16, "n": 8, "temperature": 1.0, "max_tokens": 8192}


class PGenRMOptions(_PresetOption):
    """P-GenRM's options. `resolved()` gives m, n, temperature and max_tokens after the preset: a value
    the researcher set wins over the preset's."""

    preset: Literal["paper"] | None = Field(None, description="\"paper\": m=16, n=8, temperature 1.0, "
                                                              "max_tokens 8192, as the P-GenRM paper; options "
                                                              "set explicitly win.")
    chain_format: Literal["native", "published"] = Field(
        "native", description="native: our evaluation chain; published: the format of the authors' released "
                              "checkpoints (analysis, then JSON between <JSON_START> and <JSON_END>).")
    # Bounds no submission can pass (issue 29: m=64 with max_tokens=1,000,000 was accepted): twice the paper's
    # m, and the judges' token budget.
    m: int = Field(4, ge=1, le=32, description="Evaluation chains sampled per pair (averaged).")
    n: int = Field(0, ge=0, le=256, description="Most similar training users whose chains are averaged in; "
                                                "n > 0 needs prototypes.")
    temperature: float = Field(0.7, ge=0, le=2, description="Chain sampling temperature; above 0 when m > 1.")
    max_tokens: int = Field(1024, ge=1, le=32768, description="Room for the whole chain and its JSON.")
    seed: int = Field(0, ge=0, le=2 ** 31 - 1, description="Chain i is sampled with seed + i.")
    prototypes: str | None = Field(None, max_length=300,
                                   description="A prototypes file (manage.py build_prototypes), named relative "
                                               "to the data folder.")
    prototype_stage: Literal["initial", "refined"] | None = Field(
        None, description="Which prototypes of the file to use; default: refined when the file holds them.")
    include_self_neighbours: bool = Field(False, description="Let the query user be one of their own similar "
                                                             "users (the authors' release does; we do not).")
    model_preset: str | None = _model_preset_field()

    def data_files(self) -> dict[str, tuple[str | None, str]]:
        """The prototypes file when n > 0 (the paper preset sets it too) or when one is named."""
        if self.resolved()["n"] > 0 or self.prototypes:
            return {"prototypes": (self.prototypes, "n > 0 needs 'prototypes': a prototypes JSON named relative to "
                                                    "the data folder (manage.py build_prototypes).")}
        return {}

    def resolved(self) -> dict[str, Any]:
        preset = PAPER_PRESET if self.preset == "paper" else {}
        return {key: getattr(self, key) if key in self.model_fields_set or key not in preset else preset[key]
                for key in ("m", "n", "temperature", "max_tokens")}

    def requests_per_pair(self) -> int:
        """m + n: the resolved m chains for the user and one chain for each of up to n neighbours
        (`pgenrm.PGenRM.judge_pair`; neighbours only in the profile setting and for a user with
        signals, so an upper bound)."""
        resolved = self.resolved()
        return int(resolved["m"]) + int(resolved["n"])

    def answer_budget(self) -> int:
        return int(self.resolved()["max_tokens"])

    @field_validator("prototypes")
    @classmethod
    def _relative_name(cls, value: str | None) -> str | None:
        if value is None or value == "":
            return None
        path = PurePosixPath(value.replace("\\", "/"))
        if path.is_absolute() or ".." in path.parts or "\x00" in value:
            raise ValueError("must be a file name relative to the data folder, without '..'")
        return value


# --- downstream runs: what a Best-of-N or PPO reproduction sets ------------------------------
# Staff set these (run_best_of_n / run_ppo --option key=value); they are stored with the run,
# passed to the sampler or trainer as they are, and recorded in the run's manifest. README,
# "Reproduction knobs", compares each default with the published script's value.

def release_run_values(knobs: Mapping[str, Any], data: Any) -> Any:
    """A downstream run's raw options with protocol 'release' filled in: every knob the release sets
    (`knobs`: protocols.RELEASE_BEST_OF_N or RELEASE_PPO) that the options leave unset takes the
    release's value; one set to another value is refused, naming it (the run would not be the
    release's). Other data as given."""
    if not isinstance(data, Mapping) or data.get("protocol") != "release":
        return data
    filled = dict(data)
    for key, value in knobs.items():
        if key in filled and filled[key] != value:
            raise ValueError(f"option '{key}' is {filled[key]!r} but protocol 'release' runs the authors' value "
                             f"{value!r}: leave it unset, or use protocol 'prbench'")
        filled[key] = value
    return filled


class _DownstreamRunOptions(_Options):
    """A downstream run's options: under protocol 'release' the knobs `release_knobs` are filled in
    (release_run_values)."""

    release_knobs: ClassVar[Mapping[str, Any]] = {}

    @model_validator(mode="before")
    @classmethod
    def _release(cls, data: Any) -> Any:
        return release_run_values(cls.release_knobs, data)


class BestOfNOptions(_DownstreamRunOptions):
    """Sampling of the policy's N answers per question (stored on the sample set, shared by every RM);
    `protocol` decides the RM's input and the rubric judge's budget and reading (the run's)."""

    n: int = Field(16, ge=1, le=256, description="Answers sampled per question (N); k runs over 1, 2, 4, ... N.")
    temperature: float = Field(0.8, ge=0, le=2, description="Policy sampling temperature.")
    top_p: float | None = Field(None, gt=0, le=1, description="Nucleus sampling: the smallest set of tokens whose "
                                                              "probability reaches top_p; null: not sent (the "
                                                              "endpoint's default, 1).")
    max_new_tokens: int = Field(256, ge=1, le=32768, description="Most tokens per answer (a cut answer is asked "
                                                                 "again with twice the room, else fails).")
    seed: int = Field(0, ge=0, le=2 ** 31 - 1, description="Seed of each item's request (top-ups derive theirs).")
    protocol: ProtocolName = Field("prbench", description=(
        "prbench: our sampling defaults, the RM sees the setting's context, an unreadable rubric verdict is "
        "dropped; release: the authors' BoN scripts (n 16, temperature 1.0, top_p 0.9, 512 tokens; the RM "
        "scores question + profile joined without a separator; the judge answers a list in 32 tokens, an "
        "unreadable answer scores 0 and stays in the mean). docs/protocols.md."))

    release_knobs: ClassVar[Mapping[str, Any]] = RELEASE_BEST_OF_N


class PPOOptions(_DownstreamRunOptions):
    """TRL PPO (trl.experimental.ppo.PPOConfig) as `prblib.downstream.ppo.train_ppo` runs it."""

    steps: int = Field(64, ge=1, le=100_000, description="PPO updates; each samples batch_size prompts.")
    batch_size: int = Field(8, ge=1, le=1024, description="Prompts (rollouts) per update.")
    mini_batches: int = Field(1, ge=1, le=1024, description="Mini-batches each update's batch is split into "
                                                            "(batch_size must be a multiple).")
    ppo_epochs: int = Field(4, ge=1, le=100, description="Passes over each batch's rollouts.")
    learning_rate: float = Field(3e-6, gt=0, le=1, description="AdamW learning rate of the policy and the value "
                                                               "head (TRL trains both with one optimizer).")
    vf_coef: float = Field(0.1, ge=0, le=100, description="Weight of the value loss in the joint loss: the value "
                                                          "model's step size relative to the policy's.")
    kl_coef: float = Field(0.05, ge=0, le=10, description="Per-token KL penalty against the frozen reference "
                                                          "policy, subtracted from the reward.")
    cliprange: float = Field(0.2, gt=0, le=10, description="PPO ratio clipping of the policy loss.")
    cliprange_value: float = Field(0.2, gt=0, le=100, description="Clipping of the value loss.")
    gamma: float = Field(1.0, ge=0, le=1, description="Discount factor.")
    lam: float = Field(0.95, ge=0, le=1, description="GAE lambda.")
    whiten_rewards: bool = Field(False, description="Normalise rewards to mean 0, variance 1 per mini-batch "
                                                    "(needs mini-batches of at least 8).")
    reward_scale: float = Field(1.0, gt=0, le=1000, description="Factor the RM's score is multiplied by before "
                                                                "it becomes the PPO reward.")
    response_length: int = Field(256, ge=1, le=32768, description="Most tokens per rollout and per held-out answer.")
    temperature: float = Field(0.7, gt=0, le=2, description="Rollout sampling temperature (answers to judge are "
                                                            "greedy).")
    seed: int = Field(0, ge=0, le=2 ** 31 - 1, description="Seed of training and of the held-out answers.")
    eval_fraction: float = Field(0.2, gt=0, lt=1, description="Share of the benchmark's questions held out to "
                                                              "judge (never trained on).")
    critic_learning_rate: float | None = Field(None, gt=0, le=1, description=(
        "AdamW learning rate of the value model, in a parameter group of its own; null: the policy's "
        "(TRL's one rate)."))
    weight_decay: float = Field(0.0, ge=0, le=1, description="AdamW weight decay of policy and value model.")
    lr_schedule: Literal["linear", "constant"] = Field("linear", description="Learning-rate schedule over the "
                                                                             "updates (TRL's default: linear).")
    missing_reward: float | None = Field(None, ge=-1000, le=1000, description=(
        "The reward of a rollout the RM gave no score (a judge's unreadable verdict), unscaled; null: 0 for "
        "judges, and a scalar RM must score every rollout."))
    answer_temperature: float = Field(0.0, ge=0, le=2, description="Sampling temperature of the held-out answers "
                                                                   "(0: greedy).")
    answer_top_p: float | None = Field(None, gt=0, le=1, description="Nucleus sampling of the held-out answers; "
                                                                     "null: not used.")
    protocol: ProtocolName = Field("prbench", description=(
        "prbench: our PPO defaults; release: the authors' verl run (batch 128, mini-batches of 16, one epoch "
        "per batch, actor lr 5e-7, critic lr 5e-6, weight decay 0.01, constant rate, 512 tokens, rollouts at "
        "temperature 1.0, no KL, GAE lam 1.0, value clip 0.5, reward = the RM's score / 10 and 0.5 when "
        "there is none, held-out answers at temperature 1.0 and top_p 0.9). docs/protocols.md."))

    release_knobs: ClassVar[Mapping[str, Any]] = RELEASE_PPO

    @model_validator(mode="after")
    def _whole_mini_batches(self):
        if self.batch_size % self.mini_batches:
            raise ValueError(f"batch_size {self.batch_size} is not a multiple of mini_batches {self.mini_batches}")
        if self.whiten_rewards and self.batch_size // self.mini_batches < 8:
            raise ValueError("whiten_rewards needs mini-batches of at least 8 rollouts (batch_size / mini_batches)")
        return self


# The kind each options model with a model_preset belongs to (its registry entry names the model).
_OPTIONS_KIND = {entry.options: entry.name for entry in registry.KINDS}

# {outcome kind: the options model of its runs}, from the registry (`OutcomeKindInfo.run_options`).
RUN_OPTIONS: dict[str, type[_Options]] = {o.name: globals()[o.run_options] for o in registry.OUTCOME_KINDS
                                          if o.run_options}


def parse_run_options(run_kind: str, raw: Mapping[str, Any] | None,
                      columns: Mapping[str, Any] | None = None) -> Any:
    """A downstream run's typed options ("best_of_n" or "ppo") from a JSON object, with `columns`
    (knobs a run stores in columns of their own, e.g. PPO's steps) over it; OptionsError naming the
    first bad key (a whole-object check, such as mini_batches, names ""), or saying what `raw` is
    when it is not an object ("options must be a JSON object, not an array")."""
    model = RUN_OPTIONS[run_kind]
    if not isinstance(raw or {}, Mapping):
        name = type_name(raw)
        raise OptionsError(f"options must be a JSON object, not {'an array' if name == 'a list' else name}")
    try:
        return model.model_validate({**(raw or {}), **(columns or {})})
    except ValidationError as exc:
        raise _first_error(run_kind, model, exc) from None


def run_options_doc(run_kind: str) -> list[dict[str, Any]]:
    """[{name, type, default, minimum, maximum, description}] of a downstream run's options."""
    return _doc(RUN_OPTIONS[run_kind])


def options_model(kind: str) -> type[_Options]:
    """The options model of `kind`: the class named by its registry entry (`registry.RMKind.options`).
    OptionsError naming the known kinds for an unknown one."""
    try:
        entry = registry.kind(kind)
    except registry.UnknownName as exc:
        raise OptionsError(str(exc)) from None
    model = globals().get(entry.options)
    if not (isinstance(model, type) and issubclass(model, _Options)):
        raise OptionsError(f"the {kind} kind names options {entry.options!r}, which prblib.rewards.options does not "
                           "define")
    return model


def options_models() -> dict[str, type[_Options]]:
    """{kind: its options model} for every kind in the registry, in registry order."""
    return {name: options_model(name) for name in registry.kind_names()}


def parse_options(kind: str, raw: Mapping[str, Any] | None) -> Any:
    """The kind's typed options from a JSON object; OptionsError naming the first bad key.

    Shapes: raw is a JSON object ({} or None for defaults); returns an instance of the kind's
    model (options_model: frozen, defaults filled in)."""
    model = options_model(kind)
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise OptionsError(f"options must be a JSON object, not {type(raw).__name__}")
    try:
        return model.model_validate(dict(raw))
    except ValidationError as exc:
        raise _first_error(kind, model, exc) from None


def validate_options(kind: str, raw: Mapping[str, Any] | None) -> dict[str, Any]:
    """Check `raw` against the kind's schema and return what to store: the keys the
    researcher set, normalised (defaults are applied when the model loads)."""
    return parse_options(kind, raw).model_dump(exclude_unset=True)


def _first_error(kind: str, model: type[_Options], exc: ValidationError) -> OptionsError:
    error = exc.errors()[0]
    key = ".".join(str(p) for p in error["loc"]) or ""
    allowed = ", ".join(model.model_fields) or "none"
    if error["type"] == "extra_forbidden":
        what = f"a {kind.replace('_', '-')} run" if kind in RUN_OPTIONS else f"the {kind} kind"
        return OptionsError(f"option '{key}' is not an option of {what} (allowed: {allowed})", key=key)
    message = error["msg"]
    if message.startswith("Value error, "):
        message = message[len("Value error, "):]
    return OptionsError(f"option '{key}': {message}" if key else f"options: {message}", key=key)


def options_doc(kind: str) -> list[dict[str, Any]]:
    """[{name, type, default, minimum, maximum, description}] for forms and docs."""
    return _doc(options_model(kind))


def _doc(model: type[_Options]) -> list[dict[str, Any]]:
    """One row per option; `choices` lists the values of an option that takes only named ones
    (e.g. protocol), else None."""
    schema = model.model_json_schema()
    rows = []
    for name, prop in (schema.get("properties") or {}).items():
        types = [p.get("type") for p in prop.get("anyOf", [prop]) if p.get("type")]
        choices = [value for p in prop.get("anyOf", [prop])
                   for value in p.get("enum", [p["const"]] if "const" in p else [])] or None
        rows.append({"name": name, "type": " or ".join(t for t in types if t != "null") or "any",
                     "nullable": "null" in types, "default": prop.get("default"),
                     "minimum": prop.get("minimum"), "maximum": prop.get("maximum"), "choices": choices,
                     "description": prop.get("description", "")})
    return rows


def options_json_schema(kind: str) -> dict[str, Any]:
    """The kind's schema in OpenAPI 3.0's dialect (for the API document): pydantic's
    `anyOf [X, null]` becomes `X` with `nullable: true`, and what 3.0.3 does not have is said
    as it has it (`_openapi30`: `const` as a one-value `enum`, a numeric `exclusiveMinimum` /
    `exclusiveMaximum` as `minimum` / `maximum` with the boolean flag); unknown keys are not allowed."""
    schema = options_model(kind).model_json_schema()
    properties = {}
    for name, prop in (schema.get("properties") or {}).items():
        variants = prop.get("anyOf")
        if variants:
            kept = [v for v in variants if v.get("type") != "null"]
            prop = {**{k: v for k, v in prop.items() if k != "anyOf"}, **(kept[0] if len(kept) == 1 else
                                                                          {"anyOf": kept})}
            if len(kept) < len(variants):
                prop["nullable"] = True
        properties[name] = _openapi30(prop)
    return {"type": "object", "title": schema.get("title", kind), "description": schema.get("description", ""),
            "properties": properties, "additionalProperties": False}


def _openapi30(schema: Any) -> Any:
    """A JSON Schema (2020-12, pydantic's) value in OpenAPI 3.0.3's dialect, nested schemas included."""
    if isinstance(schema, list):
        return [_openapi30(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: _openapi30(value) if key in ("items", "anyOf", "oneOf", "allOf", "not", "properties",
                                             "additionalProperties") else value
           for key, value in schema.items()}
    if "properties" in schema and isinstance(schema["properties"], dict):
        out["properties"] = {name: _openapi30(value) for name, value in schema["properties"].items()}
    if "const" in out:
        out["enum"] = [out.pop("const")]
    for bound, flag in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        value = out.get(bound)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[flag], out[bound] = value, True
    return out
