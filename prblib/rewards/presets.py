"""Model presets: what a family of released reward models needs to run here with its own conventions.

A preset is data (reward-bench's per-model configuration is the model): it names a family and fixes
its kind, how the chat template is handled, its prompt format and answer parser, its generation
parameters, its protocol default and its RM type (the paper's three groups: scalar classifiers,
generative judges, fine-tuned / reasoning RMs). Choosing one (`preset` on the submit form and the
API, `evaluate_rm --preset NAME`) expands into the kind and the options below: `expand(name, kind,
options)` returns the kind and the options to store, the preset's values under the researcher's
(an option set explicitly wins), with `model_preset` naming the preset. The stored options thus
say everything the preset set (they are part of a result's identity and manifest); a submission
without a preset keeps today's behaviour.

Fields of a `Preset`:
    name           the stored value (`options.model_preset`, `--preset`, the API's `preset`)
    label, family  what people read; `models` the released checkpoints it fits (Hub names)
    kind           the registry kind it runs as
    rm_type        "scalar" | "generative" | "fine_tuned" (RM_TYPES): the paper's table groups by it
    architecture   the transformers class a model folder must load as (None: served by an endpoint)
    chat_template  "model": the folder's own chat template renders the turns (a template refusing
                   a system message gets it folded into the first user turn, prblib.chat);
                   "endpoint": the server applies its own
    options        the kind's options it sets: prompt format, answer parser, generation
                   parameters (temperature, max_tokens), protocol
    needs_endpoint True when it must be served by a staff endpoint (`judge_backend`), never a folder
    before         what an operator must do first (e.g. convert the checkpoint), "" when nothing
    notes          one paragraph on what the preset does and why

Plain Python: no Django, no torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from prblib import registry

RM_TYPES: tuple[tuple[str, str], ...] = (
    ("scalar", "Scalar classifiers"),
    ("generative", "Generative judges"),
    ("fine_tuned", "Fine-tuned / reasoning RMs"),
    ("other", "Other (uploaded scores)"),
)


@dataclass(frozen=True)
class Preset:
    name: str
    label: str
    family: str
    kind: str
    rm_type: str
    models: tuple[str, ...]
    options: dict[str, Any] = field(default_factory=dict)
    architecture: str | None = None
    chat_template: str = "model"
    needs_endpoint: bool = False
    before: str = ""
    notes: str = ""

    def settings_shown(self) -> list[tuple[str, str]]:
        """[(what, value)] of everything the preset fixes, for the Supported models page and the README."""
        o = self.options
        rows = [("kind", self.kind), ("RM type", rm_type_label(self.rm_type))]
        if self.architecture:
            rows.append(("architecture", self.architecture))
        rows.append(("chat template", "the model folder's own" if self.chat_template == "model"
                     else "applied by the serving endpoint"))
        if "prompt_format" in o:
            rows.append(("prompt format", o["prompt_format"]))
        if "answer_parser" in o:
            rows.append(("answer parser", o["answer_parser"]))
        if "chain_format" in o:
            rows.append(("chain format", o["chain_format"]))
        generation = [f"{k}={o[k]}" for k in ("temperature", "max_tokens", "m", "both_orders") if k in o]
        if generation:
            rows.append(("generation", ", ".join(generation)))
        rows.append(("protocol", o.get("protocol", registry.DEFAULT_PROTOCOL)))
        if self.needs_endpoint:
            rows.append(("served by", "a staff endpoint (judge_backend), never a folder"))
        if self.before:
            rows.append(("before", self.before))
        return rows


_SCALAR_NOTE = ("The setting's context (question, with profile posts or plan) is the user turn and the answer the "
                "assistant turn, rendered by the folder's chat template; the single-logit head's value is the score.")

PRESETS: tuple[Preset, ...] = (
    Preset("skywork-reward-v2-llama", "Skywork-Reward-V2 (Llama-3.1 base)", "Skywork-Reward-V2", "scalar", "scalar",
           ("Skywork/Skywork-Reward-V2-Llama-3.1-8B", "Skywork/Skywork-Reward-V2-Llama-3.1-8B-40M",
            "Skywork/Skywork-Reward-V2-Llama-3.2-1B", "Skywork/Skywork-Reward-V2-Llama-3.2-3B"),
           {"protocol": "prbench", "prefix_cache": True}, architecture="LlamaForSequenceClassification",
           notes=_SCALAR_NOTE),
    Preset("skywork-reward-v2-qwen3", "Skywork-Reward-V2 (Qwen3 base)", "Skywork-Reward-V2", "scalar", "scalar",
           ("Skywork/Skywork-Reward-V2-Qwen3-0.6B", "Skywork/Skywork-Reward-V2-Qwen3-1.7B",
            "Skywork/Skywork-Reward-V2-Qwen3-4B", "Skywork/Skywork-Reward-V2-Qwen3-8B"),
           {"protocol": "prbench", "prefix_cache": True}, architecture="Qwen3ForSequenceClassification",
           notes=_SCALAR_NOTE),
    Preset("internlm2-reward", "InternLM2 reward (converted)", "InternLM2-Reward", "scalar", "scalar",
           ("internlm/internlm2-1_8b-reward", "internlm/internlm2-7b-reward", "internlm/internlm2-20b-reward"),
           {"protocol": "prbench", "prefix_cache": True}, architecture="LlamaForSequenceClassification",
           before="staff convert the checkpoint first (manage.py convert_internlm2 SOURCE NEW-FOLDER): the "
                  "preset runs the converted folder, never the checkpoint's own code",
           notes="InternLM2's released checkpoints need their own Python (InternLM2ForRewardModel), which we never "
                 "run; the converted folder is a built-in Llama sequence classifier with the reward head as its "
                 "classification head. " + _SCALAR_NOTE),
    Preset("rm-r1-instruct", "RM-R1 (Qwen2.5-Instruct variants)", "RM-R1", "pairwise", "fine_tuned",
           ("gaotang/RM-R1-Qwen2.5-Instruct-7B", "gaotang/RM-R1-Qwen2.5-Instruct-14B",
            "gaotang/RM-R1-Qwen2.5-Instruct-32B"),
           {"prompt_format": "rm-r1", "answer_parser": "rm_r1", "temperature": 0.0, "max_tokens": 4096,
            "both_orders": True, "protocol": "prbench"},
           notes="Chain-of-rubrics: the judge names the task type, writes a rubric (or solves the problem), "
                 "evaluates both answers and ends with <answer>[[A]]</answer> or <answer>[[B]]</answer>; both "
                 "orders are judged."),
    Preset("rm-r1-distilled", "RM-R1 (DeepSeek-distilled variants)", "RM-R1", "pairwise", "fine_tuned",
           ("gaotang/RM-R1-DeepSeek-Distilled-Qwen-7B", "gaotang/RM-R1-DeepSeek-Distilled-Qwen-14B",
            "gaotang/RM-R1-DeepSeek-Distilled-Qwen-32B"),
           {"prompt_format": "rm-r1-reasoning", "answer_parser": "rm_r1", "temperature": 0.0, "max_tokens": 8192,
            "both_orders": True, "protocol": "prbench"},
           notes="The model thinks first (a <think> block, kept apart and never parsed), then gives "
                 "<answer>[[A]]</answer> or <answer>[[B]]</answer>; room for long reasoning."),
    Preset("r3-pairwise", "R3 / mR3, pairwise task format", "R3", "pairwise", "fine_tuned",
           ("rubricreward/R3-Qwen3-4B-4k", "rubricreward/R3-Qwen3-8B-14k", "rubricreward/R3-Qwen3-14B-4k",
            "rubricreward/mR3-Qwen3-8B"),
           {"prompt_format": "r3", "answer_parser": "r3_json", "temperature": 0.0, "max_tokens": 8192,
            "both_orders": True, "protocol": "prbench"},
           notes="Task, input, two responses, a rubric and the output format in one message; the answer is a JSON "
                 "object {explanation, score}, the score naming the better response, possibly after thinking."),
    Preset("r3-pointwise", "R3 / mR3, pointwise task format", "R3", "pointwise", "fine_tuned",
           ("rubricreward/R3-Qwen3-4B-4k", "rubricreward/R3-Qwen3-8B-14k", "rubricreward/mR3-Qwen3-8B"),
           {"prompt_format": "r3", "answer_parser": "r3_json", "temperature": 0.0, "max_tokens": 8192},
           notes="Each answer rated alone on a 1-5 rubric; the JSON score is the rating; the pair is correct when "
                 "the chosen answer's rating is strictly higher."),
    Preset("r3-binary", "R3 / mR3, binary task format", "R3", "pointwise", "fine_tuned",
           ("rubricreward/R3-Qwen3-4B-4k", "rubricreward/R3-Qwen3-8B-14k", "rubricreward/mR3-Qwen3-8B"),
           {"prompt_format": "r3-binary", "answer_parser": "r3_binary", "temperature": 0.0, "max_tokens": 8192},
           notes="Each answer judged alone as good (true) or not (false) for this person; true scores 1, false "
                 "0, so a pair is correct only when the chosen answer is true and the rejected one false."),
    Preset("openai-compatible-judge", "Hosted judge (OpenAI-compatible API)", "Hosted LLM judge", "pairwise",
           "generative", ("gpt-5.1", "claude-sonnet-4.6", "gemini-3-flash"),
           {"prompt_format": "prbench", "temperature": 0.0, "max_tokens": 4096, "both_orders": True,
            "protocol": "prbench"},
           chat_template="endpoint", needs_endpoint=True,
           before="staff declare the endpoint once per model family (manage.py llm_endpoint add NAME --base-url URL "
                  "--model MODEL [--token-parameter max_completion_tokens] [--no-temperature] [--no-seed] [--no-n] "
                  "[--reasoning-effort LEVEL] --api-key-env VAR): its capabilities are the per-model parameters",
           notes="Our pairwise prompt; what the API accepts (token parameter name, temperature, seed, n, reasoning "
                 "effort) comes from the endpoint's declared capabilities, and only its allowed models may be "
                 "named; room for hosted reasoning models' answers."),
    Preset("p-genrm-released", "P-GenRM released checkpoints", "P-GenRM", "pgenrm", "fine_tuned",
           ("Tongyi-ConvAI/P-GenRM-8B-PRISM", "Tongyi-ConvAI/P-GenRM-8B-ChatbotArena"),
           {"chain_format": "published", "m": 16, "temperature": 1.0, "max_tokens": 8192},
           notes="The released chain format (analysis, then JSON between <JSON_START> and <JSON_END>) with the "
                 "paper's 16 chains at temperature 1; add n=8 and a prototypes file for its similar-user "
                 "scaling."),
)


class UnknownPreset(ValueError):
    """A preset name that is not in PRESETS, or one that does not go with the kind asked for."""


def preset_names() -> tuple[str, ...]:
    return tuple(p.name for p in PRESETS)


def preset_choices() -> list[tuple[str, str]]:
    return [(p.name, p.label) for p in PRESETS]


def preset(name: str) -> Preset:
    """The preset named `name`; UnknownPreset listing the known ones."""
    for entry in PRESETS:
        if entry.name == name:
            return entry
    raise UnknownPreset(f"unknown preset {name!r} (known: {', '.join(preset_names())})")


def rm_type_label(rm_type: str) -> str:
    return dict(RM_TYPES).get(rm_type, rm_type)


def rm_type_of(kind: str, options: dict[str, Any] | None) -> str:
    """The RM type of a result: its preset's, else its kind's (`registry.RMKind.rm_type`; "other" for a
    kind the registry does not know)."""
    name = (options or {}).get("model_preset")
    if isinstance(name, str) and name in preset_names():
        return preset(name).rm_type
    try:
        return registry.kind(kind).rm_type
    except registry.UnknownName:
        return "other"


def expand(name: str, kind: str | None, options: dict[str, Any] | None) -> tuple[str, dict[str, Any]]:
    """(kind, options to validate and store) for preset `name`: the preset's options under the ones
    given (an explicit option wins), with model_preset = name. UnknownPreset for an unknown name, or
    a `kind` given that is not the preset's."""
    entry = preset(name)
    if kind and kind != entry.kind:
        raise UnknownPreset(f"preset {name!r} runs as the {entry.kind} kind, not {kind}")
    given = dict(options or {})
    if given.get("model_preset") not in (None, name):
        raise UnknownPreset(f"options name preset {given['model_preset']!r} but the preset chosen is {name!r}")
    return entry.kind, {**entry.options, **given, "model_preset": name}
