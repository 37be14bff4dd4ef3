"""What reproduces a result: code and library versions, and the inputs that fix it.

Every evaluation run, Best-of-N and PPO run, build and derived benchmark version records
`environment()` plus its own inputs (weights hash, benchmark content hash, prompt template
versions, options, seeds, device, dtype), so a figure can be traced to what produced it."""

from __future__ import annotations

import functools
import os
import platform
import subprocess
from importlib import metadata
from typing import Any

from django.conf import settings

# The libraries whose versions can change a figure: the model code, the numerics, the weights
# reader. A manifest is public once its result is published, so it names nothing else of the
# server (not the web framework, the task queue or the HTTP client, whose versions would only
# tell an attacker what to try): what reproduces a number, and no more.
LIBRARIES = ("torch", "transformers", "trl", "numpy", "scipy", "scikit-learn", "safetensors")


@functools.lru_cache(maxsize=1)
def code_version() -> str:
    """The git commit of the code (with "+dirty" when files differ from it), or the
    PRBENCH_CODE_VERSION environment variable where there is no git checkout (e.g. a container image)."""
    configured = os.environ.get("PRBENCH_CODE_VERSION", "")
    if configured:
        return configured
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=settings.BASE_DIR, capture_output=True, text=True,
                                timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=settings.BASE_DIR,
                               capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return commit + ("+dirty" if dirty else "")


@functools.lru_cache(maxsize=1)
def environment() -> dict[str, Any]:
    """{code_version, python, libraries {name: version or None}} of this process."""
    versions = {}
    for name in LIBRARIES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return {"code_version": code_version(), "python": platform.python_version(), "libraries": versions}


def manifest(**inputs: Any) -> dict[str, Any]:
    """environment() plus the given inputs (plain JSON values)."""
    return {**environment(), **inputs}


def prompt_templates() -> dict[str, Any]:
    """Every fixed prompt the platform sends, by key (name@vN): the judges' and the policy's
    `prompts.TextTemplate`s and the built-in generation templates. What the pinned-hash test reads."""
    from pipeline.ml import bon, generation, judges, pgenrm, pgenrm_published, reasoning
    from pipeline.ml.prompts import TextTemplate

    texts = [judges.PAIRWISE_TEMPLATE, judges.RELEASE_TEMPLATE, judges.POINTWISE_TEMPLATE, pgenrm.NATIVE_TEMPLATE,
             pgenrm_published.PUBLISHED_TEMPLATE, bon.RUBRIC_JUDGE_TEMPLATE, bon.RELEASE_RUBRIC_JUDGE_TEMPLATE,
             bon.POLICY_TEMPLATE]
    texts += [TextTemplate(t.name, t.version, (t.system or "", t.user)) for t in
              (generation.CHOSEN_TEMPLATE, generation.AVOID_GENERIC_TEMPLATE, generation.AVOID_CONTRARY_TEMPLATE,
               generation.PLANNER_TEMPLATE)]
    texts += [*reasoning.TEMPLATES.values(), *reasoning.POINTWISE_TEMPLATES.values()]  # RM-R1's and R3's formats
    return {t.key: t for t in texts}


def template_versions(kind: str, options: dict[str, Any] | None = None, *,
                      template_file: str | None = None) -> dict[str, str]:
    """{role: "name@vN"} of the prompts a reward model of `kind` with `options` sends (the
    manifest's "templates"): the registry entry's `prompts` decide; {} for kinds that are not
    prompted. An operator's `template_file` is recorded as "file:<sha256 of its text>"."""
    from pipeline.ml import registry

    return registry.kind(kind).prompt_versions(options, template_file=template_file)


def downstream_template_versions(*, rm_kind: str, rm_options: dict[str, Any] | None = None,
                                 protocol: str = "prbench") -> dict[str, str]:
    """The prompts behind a Best-of-N or PPO outcome: the policy's, the rubric judge's (under the
    run's `protocol`) and the RM's own (when it is prompted)."""
    from pipeline.ml import bon

    return {"policy": bon.POLICY_TEMPLATE.key, "rubric_judge": bon.rubric_judge_template(protocol).key,
            **{f"rm_{role}": key for role, key in template_versions(rm_kind, rm_options).items()}}
