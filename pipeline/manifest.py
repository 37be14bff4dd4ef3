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
from pathlib import Path
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
    from prblib.downstream import bon
    from prblib.construction import generation
    from prblib.rewards import judges
    from prblib.rewards.pgenrm import model as pgenrm
    from prblib.rewards.pgenrm import published as pgenrm_published
    from prblib.rewards import reasoning
    from prblib.prompts import TextTemplate

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
    from prblib import registry

    return registry.kind(kind).prompt_versions(options, template_file=template_file)


def downstream_template_versions(*, rm_kind: str, rm_options: dict[str, Any] | None = None,
                                 protocol: str = "prbench") -> dict[str, str]:
    """The prompts behind a Best-of-N or PPO outcome: the policy's, the rubric judge's (under the
    run's `protocol`) and the RM's own (when it is prompted)."""
    from prblib.downstream import bon

    return {"policy": bon.POLICY_TEMPLATE.key, "rubric_judge": bon.rubric_judge_template(protocol).key,
            **{f"rm_{role}": key for role, key in template_versions(rm_kind, rm_options).items()}}


# --- what a result is: its configuration -------------------------------------------------------

# Files of a model folder that decide how text becomes tokens (tokenizer_config.json without its
# chat template: that has its own hash).
TOKENIZER_HASHED = ("tokenizer.json", "tokenizer.model", "vocab.txt", "vocab.json", "merges.txt", "spiece.model",
                    "sentencepiece.bpe.model", "special_tokens_map.json", "added_tokens.json")


def folder_hashes(folder: Path | str | None) -> dict[str, str | None]:
    """{tokenizer_sha256, chat_template_sha256} of a model folder (already through the folder
    check, so every file stays inside it): sha256 hex over the tokenizer's files present
    (TOKENIZER_HASHED, each as "name\\0sha256(bytes)\\n", in that order, then tokenizer_config.json
    as canonical JSON without "chat_template"), and over the chat templates the folder holds (the
    loader's `_chat_templates`, as canonical JSON); None where the folder has none. Both None
    without a folder (an uploaded scores file, a served model)."""
    import hashlib
    import json

    from prblib import modelcheck
    from prblib.rows import load_json

    if folder is None:
        return {"tokenizer_sha256": None, "chat_template_sha256": None}
    folder = Path(folder)
    digest, seen = hashlib.sha256(), False
    for name in TOKENIZER_HASHED:
        file = folder / name
        if file.is_file():
            with modelcheck._open_regular(file, name) as fh:
                digest.update(f"{name}\0{hashlib.sha256(fh.read()).hexdigest()}\n".encode())
            seen = True
    config_file = folder / "tokenizer_config.json"
    if config_file.is_file():
        with modelcheck._open_regular(config_file, "tokenizer_config.json") as fh:
            data = load_json(fh.read().decode("utf-8", "replace"), constants=True)
        if isinstance(data, dict):
            data = {k: v for k, v in data.items() if k != "chat_template"}
        digest.update(b"tokenizer_config.json\0" + json.dumps(data, sort_keys=True).encode())
        seen = True
    templates = modelcheck._chat_templates(folder)
    template_hash = (hashlib.sha256(json.dumps(templates, sort_keys=True, default=str).encode()).hexdigest()
                     if templates else None)
    return {"tokenizer_sha256": digest.hexdigest() if seen else None, "chat_template_sha256": template_hash}


def resolved_options(kind: str, options: dict[str, Any] | None) -> dict[str, Any]:
    """The kind's options with every default filled in (`parse_options(...).model_dump()`), and
    for options with a `resolved()` (P-GenRM: m, n, temperature, max_tokens after the preset) its
    values over them, so the manifest records what ran, not what was typed. OptionsError for
    options that do not parse."""
    from prblib.rewards.options import parse_options

    typed = parse_options(kind, options or {})
    out = typed.model_dump(mode="json")
    if callable(getattr(typed, "resolved", None)):
        out.update(typed.resolved())
    return out


def data_file_hashes(kind: str, options: dict[str, Any] | None) -> dict[str, dict[str, str | None]]:
    """{option key: {"path" (relative to DATA_ROOT, as given), "sha256" (content_sha256, None when
    the file is missing)}} for every data file the options name (`data_files()`: P-GenRM's
    prototypes file, an operator's prompt template). A path leaving DATA_ROOT is recorded
    without a hash."""
    from prblib.rewards.options import parse_options
    from prblib.rows import content_sha256

    root = Path(settings.DATA_ROOT).resolve()
    out: dict[str, dict[str, str | None]] = {}
    for key, (name, _) in sorted(parse_options(kind, options or {}).data_files().items()):
        if not name:
            continue
        file = (root / name).resolve()
        inside = file.is_relative_to(root) and file.is_file()
        out[key] = {"path": name, "sha256": content_sha256(file) if inside else None}
    return out


def configuration(*, kind: str, options: dict[str, Any] | None, dtype: str, max_length: int, profile_k: int,
                  folder: Path | str | None = None) -> dict[str, Any]:
    """What, besides the weights and the benchmark, makes a result what it is: {kind, options
    (`resolved_options`), dtype, max_length, profile_k, tokenizer_sha256, chat_template_sha256
    (`folder_hashes`), data_files (`data_file_hashes`: the prototypes file's hash, ...)}. The
    same weights with another tokenizer, chat template, prototypes file or option are another
    configuration, so another result (leaderboard.identity.fingerprint_of hashes this)."""
    return {"kind": kind, "options": resolved_options(kind, options), "dtype": dtype, "max_length": int(max_length),
            "profile_k": int(profile_k), **folder_hashes(folder), "data_files": data_file_hashes(kind, options)}


def configuration_sha256(config: dict[str, Any]) -> str:
    """sha256 hex of a `configuration` as canonical JSON (sorted keys)."""
    import hashlib
    import json

    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()


def model_shown(path: Path | str) -> str:
    """A model folder as a manifest records it: relative to MODELS_ROOT when inside it (what
    `evaluate_rm --model` and `rerun` accept as written), else as given."""
    resolved = Path(path).resolve()
    root = Path(settings.MODELS_ROOT).resolve()
    return str(resolved.relative_to(root)) if resolved.is_relative_to(root) else str(path)


def judge_endpoint_shown(endpoint: Any, model: str) -> dict[str, Any]:
    """A served model as a manifest names it: {name, model, base_url_sha256 (which server, without
    publishing an operator's address), token_parameter, reasoning_effort} of the staff endpoint."""
    import hashlib

    return {"name": endpoint.name, "model": model,
            "base_url_sha256": hashlib.sha256(str(endpoint.base_url).encode()).hexdigest(),
            "token_parameter": getattr(endpoint, "token_parameter", None),
            "reasoning_effort": getattr(endpoint, "reasoning_effort", None) or None}


def evaluation_manifest(*, kind: str, setting: str, benchmark: Any, model: str, weights_hash: str,
                        device: str, dtype: str, max_length: int, batch_size: int, profile_k: int,
                        options: dict[str, Any] | None, folder: Path | str | None = None,
                        judge_backend: Any = None, limit: int | None = None,
                        template_file: str | None = None) -> dict[str, Any]:
    """The manifest of one evaluation (a worker's run and `evaluate_rm` alike: one function, the
    same keys), what `rerun` reads back: environment() plus kind, setting, benchmark and its
    content_hash, model (relative to MODELS_ROOT, or a served model's name), weights_hash,
    judge_backend (the endpoint's name) and judge_endpoint (`judge_endpoint_shown`) for a served
    model, device, dtype, max_length, batch_size, profile_k, limit, options (as stored),
    resolved_options, seed (the resolved options' seed, None for kinds without one), protocol,
    templates (name@vN, or file:sha256 of an operator's template), tokenizer_sha256,
    chat_template_sha256 and data_files {key: {path, sha256}} (`configuration`)."""
    from prblib import registry

    config = configuration(kind=kind, options=options, dtype=dtype, max_length=max_length, profile_k=profile_k,
                           folder=folder)
    endpoint = None
    if judge_backend is not None:
        endpoint = judge_endpoint_shown(judge_backend, model)
    return manifest(
        kind=kind, setting=setting, benchmark=benchmark.name, benchmark_content_hash=benchmark.content_hash,
        weights_hash=weights_hash, model=model, judge_backend=judge_backend.name if judge_backend else None,
        judge_endpoint=endpoint, device=device, dtype=dtype, max_length=max_length, batch_size=batch_size,
        profile_k=profile_k, limit=limit, options=dict(options or {}), resolved_options=config["options"],
        seed=config["options"].get("seed"), protocol=registry.protocol_of(kind, options),
        templates=template_versions(kind, options, template_file=template_file),
        tokenizer_sha256=config["tokenizer_sha256"], chat_template_sha256=config["chat_template_sha256"],
        data_files=config["data_files"])


def weights_identity(*, kind: str, path: str, endpoint: Any = None) -> str:
    """The weights hash `evaluate_rm` records, as a submission's is made: a model folder's
    `weights_digest` (every weight file's bytes, then config.json), an uploaded scores file's
    content_sha256, or sha256("endpoint name|base url|model") for a served model. ModelError for
    a folder the check refuses."""
    import hashlib

    from prblib import registry
    from prblib.modelcheck import check_model_folder, weights_digest
    from prblib.rows import content_sha256

    if endpoint is not None:
        return hashlib.sha256(f"{endpoint.name}|{endpoint.base_url}|{path}".encode()).hexdigest()
    entry = registry.kind(kind)
    if "scores_file" in entry.needs:
        return content_sha256(path)
    root = Path(settings.MODELS_ROOT).resolve()
    inside = Path(path).resolve().is_relative_to(root)
    folder, _, weights = check_model_folder(Path(path), task=entry.model_task, models_root=root if inside else None)
    return weights_digest(folder, weights)


def model_argument(raw: str) -> Path:
    """A model folder as `evaluate_rm --model` and `rerun` take it: absolute as given; relative,
    first under MODELS_ROOT (how manifests and submissions name folders: "demo-random-scalar-rm"),
    else from the current folder (the README's "var/models/my-rm"). Returns the absolute folder;
    where neither exists, the one under MODELS_ROOT (the loader then names the folder as given)."""
    path = Path(raw)
    if path.is_absolute():
        return path
    under_root = Path(settings.MODELS_ROOT) / path
    if under_root.exists():
        return under_root.resolve()
    if path.exists():
        return path.resolve()
    return under_root
