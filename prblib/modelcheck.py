"""Checks on a submitted model folder, run before anything is queued or loaded.

Pure file inspection: nothing from the folder is imported or unpickled, and neither torch
nor transformers is imported (the web process calls this, and it never imports torch).
What is refused, and why:

- a path that resolves (symlinks, '..') outside the models root, and a folder holding any
  file or link (tokenizer.json, a chat template, generation_config.json, a shard...) that
  resolves outside it: submitters name folders the platform already holds, and the loader
  opens whatever the folder names, so every entry is checked before any model code runs
  (`ensure_inside_root`), links to folders followed;
- an entry that is not a regular file or folder (a FIFO, socket or device: opening a FIFO
  waits for a writer forever), and a folder with more entries, or slower to list, than
  `FolderLimits` allow: the walk reads one entry at a time and stops at the first past a
  bound, so what a check costs is bounded whatever the folder holds;
- config.json missing, unreadable or not a JSON object; any JSON file the loaders read
  (config, tokenizer and chat-template files, the shard index, safetensors headers) nested
  deeper or holding a longer number than `rows.load_json` reads;
- a chat template that does not parse and compile, or is longer than MAX_CHAT_TEMPLATE_CHARS,
  or that cannot render a short probe exchange within `chat.render_chat`'s bounds (steps,
  output size, seconds): system + user for a causal LM, user + assistant otherwise. A causal
  LM's template that refuses the system message but renders it folded passes, with the note
  `chat.SYSTEM_FOLDED_NOTE` in `ModelFolderInfo.chat_template_notes`;
- any config that asks for the folder's own Python code (`auto_map`, `custom_pipelines`):
  such code would run on our workers, so it is refused and never executed;
- a model type or architecture transformers does not build in, or one of the wrong task
  (a causal LM submitted as a scalar RM would get a randomly initialised head);
- weights only in pickle formats (pytorch_model.bin, *.pt, *.pkl...): unpickling runs code.
  Only *.safetensors weights are accepted, single-file or sharded with an index.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import math
import os
import stat
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from prblib.errors import ModelError
from prblib.rows import JSONSyntaxError, RowError, load_json

TASKS = ("sequence-classification", "causal-lm")
REMOTE_CODE_KEYS = ("auto_map", "custom_pipelines")
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.txt", "vocab.json",
                   "spiece.model", "sentencepiece.bpe.model")
SAFETENSORS_INDEX = "model.safetensors.index.json"
CHUNK = 1 << 20
MAX_HEADER_BYTES = 100 << 20  # safetensors' own limit
# JSON files transformers reads from the folder besides config.json (checked when present).
LOADER_JSON_FILES = ("tokenizer_config.json", "chat_template.json", "special_tokens_map.json",
                     "added_tokens.json", "generation_config.json", "processor_config.json",
                     "preprocessor_config.json")
MAX_CHAT_TEMPLATE_CHARS = 200_000  # real ones are a few kilobytes; parsing time grows with the text


@dataclass(frozen=True)
class FolderLimits:
    """What checking one model folder may cost: entries listed (files, links and folders, at any
    depth) and seconds spent listing them. Past either, the folder is refused and the rest unread."""

    max_entries: int = 5000
    max_seconds: float = 10.0


# The limits in force. Plain Python use keeps the defaults; the Django app replaces this with
# one reading settings.MODEL_MAX_FILES and MODEL_CHECK_SECONDS at each call (pipeline.apps).
limits_from: Callable[[], FolderLimits] = FolderLimits


@dataclass(frozen=True)
class ModelFolderInfo:
    path: str  # the resolved folder
    task: str
    model_type: str
    architectures: tuple[str, ...]
    weight_files: tuple[str, ...]  # names relative to the folder, sorted
    weights_hash: str  # weights_digest(): sha256 over the weight files' bytes, then config.json's; "" unhashed
    weights_bytes: int
    parameters: int | None  # from the safetensors headers; None if a header gave no usable shapes
    num_labels: int | None
    has_chat_template: bool
    chat_template_notes: tuple[str, ...] = ()  # e.g. chat.SYSTEM_FOLDED_NOTE


def inspect_model_folder(path: Path, *, models_root: Path, task: str = "sequence-classification",
                         hash_weights: bool = True) -> ModelFolderInfo:
    """Validate a model folder for `task` and fingerprint its weights; ModelError if refused.

    With hash_weights=False the weights are not read (only their headers): `weights_hash` is
    "" and the call costs milliseconds whatever the model's size (the web process's check;
    the worker hashes later with `weights_digest`)."""
    folder, config, weights = check_model_folder(path, task=task, models_root=models_root)
    digest = weights_digest(folder, weights) if hash_weights else ""

    parameters: int | None = 0
    for file in weights:
        count = _safetensors_parameter_count(file)
        parameters = None if count is None or parameters is None else parameters + count
    architectures = tuple(config.get("architectures") or ())
    return ModelFolderInfo(
        path=str(folder), task=task, model_type=str(config.get("model_type", "")), architectures=architectures,
        weight_files=tuple(str(f.relative_to(folder)) for f in weights), weights_hash=digest,
        weights_bytes=sum(f.stat().st_size for f in weights), parameters=parameters,
        num_labels=_num_labels(config), has_chat_template=_has_chat_template(folder),
        chat_template_notes=_chat_template_notes(folder, task),
    )


def weights_digest(folder: Path, weights: list[Path]) -> str:
    """sha256 (hex) over the bytes of `weights` in the given order (check_model_folder's: sorted
    by name), then over config.json's bytes. Reads every byte: about 0.7 CPU s per GB."""
    digest = hashlib.sha256()
    for file in weights:
        with _open_regular(file, Path(file).name) as fh:
            while chunk := fh.read(CHUNK):
                digest.update(chunk)
    with _open_regular(Path(folder) / "config.json", "config.json") as fh:
        digest.update(fh.read())
    return digest.hexdigest()


def check_model_folder(path: Path, *, task: str = "sequence-classification",
                       models_root: Path | None = None) -> tuple[Path, dict[str, Any], list[Path]]:
    """The checks without the hashing: (resolved folder, config, safetensors files sorted by name).

    With `models_root`, the folder and every file used must resolve inside it.
    Loaders call this too, so a folder that would run its own code is refused there as well.
    """
    if task not in TASKS:
        raise ModelError(f"unknown task {task!r} (known: {', '.join(TASKS)})")
    path = given = Path(path)  # messages name the folder as given, never the server's absolute paths
    root = None
    if models_root is not None:
        root = Path(models_root).resolve()
        if not path.is_absolute():
            path = root / path
    folder = path.resolve()
    if root is not None and not folder.is_relative_to(root):
        raise ModelError(f"model folder {given} is outside the models folder")
    if not folder.is_dir():
        raise ModelError(f"model folder {given} does not exist or is not a folder")
    ensure_inside_root(folder, root or own_root(folder))

    # Everything below is checked even after a failure, so the submitter sees every problem at once.
    problems: list[str] = []

    def attempt(check, *args, **kwargs):
        try:
            return check(*args, **kwargs)
        except ModelError as exc:
            problems.append(str(exc))
            return None

    config = attempt(_read_json_object, folder, "config.json", root=root, required=True)
    if config is not None:
        attempt(_refuse_remote_code, config, "config.json")
        attempt(_check_architecture, config, task)
    for name in LOADER_JSON_FILES:
        extra = attempt(_read_json_object, folder, name, root=root, required=False)
        if extra is not None:
            attempt(_refuse_remote_code, extra, name)
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        problems.append(f"no tokenizer in the model folder (expected one of: {', '.join(TOKENIZER_FILES[:4])})")
    attempt(_check_chat_template, folder, task)
    weights = attempt(_safetensors_files, folder, root=root)
    if weights and config is not None and task == "sequence-classification":
        attempt(_check_head, config, weights)
    if problems:
        raise ModelFolderProblems(problems)
    return folder, config, weights


class ModelFolderProblems(ModelError):
    """Every problem found in one model folder; `problems` lists them, the message joins them."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        super().__init__(problems[0] if len(problems) == 1 else
                         f"{len(problems)} problems: " + "; ".join(problems))


def own_root(folder: Path) -> Path:
    """The root a folder's links may reach when no models root is given: the folder itself, or
    for a Hugging Face cache snapshot (`models--org--name/snapshots/REV`, whose files link to
    `../../blobs/`) that model's cache entry."""
    folder = Path(folder).resolve()
    if folder.parent.name == "snapshots" and folder.parent.parent.name.startswith("models--"):
        return folder.parent.parent
    return folder


def ensure_inside_root(folder: Path, root: Path, *, limits: FolderLimits | None = None) -> None:
    """Refuse a folder any of whose entries (files, links, sub-folders, at any depth) resolves
    outside `root` or is neither a regular file nor a folder (a FIFO, socket or device), or
    that has more entries than `limits` allow or takes longer to list. Loaders call this
    (through check_model_folder) before transformers opens anything, because a loader reads
    whatever file names it finds in the folder: one `tokenizer.json -> /etc/...` link would
    otherwise be read on the worker. Broken links that point outside count too (inside: there
    is nothing to open). A link to a folder inside the root is walked like a folder, each real
    folder once (so a link loop ends). Entries are read one at a time (os.scandir) and counted
    as they come, so a folder of 200,000 files costs `max_entries` entries, never a full
    listing. Raises ModelError naming the first such entry by its path in the folder."""
    limits = limits or limits_from()
    folder, root = Path(folder), Path(root).resolve()
    where = "models folder" if root != folder.resolve() else "model folder"
    deadline = time.monotonic() + limits.max_seconds
    pending = [(folder, folder.resolve())]  # (the folder as reached, its real path)
    seen = {pending[0][1]}
    count = 0
    while pending:
        here, real_here = pending.pop()
        try:
            entries = os.scandir(here)
        except OSError as exc:
            raise ModelError(f"{_shown(here, folder)} in the model folder cannot be listed "
                             f"({exc.strerror or exc})") from None
        with entries:
            for entry in entries:
                count += 1
                path, shown = Path(entry.path), Path(entry.path).relative_to(folder)
                if count > limits.max_entries:
                    raise ModelError(f"the model folder has more than {limits.max_entries:,} entries (files and "
                                     "folders at any depth; the limit is MODEL_MAX_FILES)")
                if time.monotonic() > deadline:
                    raise ModelError(f"listing the model folder took longer than {limits.max_seconds:g} s (the "
                                     f"limit is MODEL_CHECK_SECONDS; stopped at {shown})")
                if entry.is_dir(follow_symlinks=False):  # inside a folder inside the root: inside too
                    real = real_here / entry.name
                elif entry.is_file(follow_symlinks=False):
                    continue
                elif entry.is_symlink():
                    real = path.resolve()
                    if not real.is_relative_to(root):
                        raise ModelError(f"{shown} in the model folder points outside the {where} "
                                         "(links must stay inside it)")
                    try:
                        mode = real.stat().st_mode
                    except OSError:  # broken, pointing inside: nothing to open
                        continue
                    if stat.S_ISREG(mode):
                        continue
                    if not stat.S_ISDIR(mode):
                        raise ModelError(f"{shown} in the model folder links to {_file_kind(mode)}, not a "
                                         "regular file or folder")
                else:
                    mode = entry.stat(follow_symlinks=False).st_mode
                    raise ModelError(f"{shown} in the model folder is {_file_kind(mode)}, not a regular file "
                                     "or folder")
                if real not in seen:
                    seen.add(real)
                    pending.append((path, real))


def _file_kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a file"


def _shown(path: Path, folder: Path) -> str:
    relative = Path(path).relative_to(folder)
    return str(relative) if relative.parts else "the folder itself"


def _open_regular(file: Path, shown: str | Path):
    """`file` opened for binary reading, if it is a regular file; ModelError naming `shown`
    otherwise. Opened without waiting (a FIFO swapped in after the walk would block an ordinary
    open until a writer came) and checked on the open descriptor, so nothing can change what
    is read between the check and the read. OSError as open() raises it."""
    fd = os.open(file, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise ModelError(f"{shown} in the model folder is {_file_kind(mode)}, not a regular file")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, "rb")


def _read_text(file: Path, shown: str | Path, errors: str = "strict") -> str:
    with _open_regular(file, shown) as fh:
        return fh.read().decode("utf-8", errors=errors)


# --- pieces ------------------------------------------------------------------------------

def _inside(file: Path, folder: Path, root: Path | None) -> Path:
    resolved = file.resolve()
    if root is not None and not resolved.is_relative_to(root):
        raise ModelError(f"{file.relative_to(folder)} in the model folder points outside the models folder")
    if not resolved.is_file():
        raise ModelError(f"{file.relative_to(folder)} in the model folder is not a regular file")
    return resolved


def _read_json_object(folder: Path, name: str, *, root: Path | None, required: bool) -> dict[str, Any] | None:
    file = folder / name
    if not file.exists() and not file.is_symlink():
        if required:
            raise ModelError(f"{name} is missing from the model folder")
        return None
    resolved = _inside(file, folder, root)
    try:
        # NaN and Infinity read as transformers reads them; depth and number size bounded.
        data = load_json(_read_text(resolved, name), constants=True)
    except (OSError, UnicodeDecodeError) as exc:
        raise ModelError(f"{name} in the model folder is not valid JSON: {exc}") from None
    except JSONSyntaxError as exc:
        raise ModelError(f"{name} in the model folder is not valid JSON: {exc.detail}") from None
    except RowError as exc:
        raise ModelError(f"{name} in the model folder is refused: {exc.reason}") from None
    if not isinstance(data, dict):
        raise ModelError(f"{name} in the model folder is not a JSON object")
    return data


def _refuse_remote_code(data: Any, name: str) -> None:
    """Refuse a config asking, at any depth, for code shipped with the model."""
    stack = [data]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            for key, value in node.items():
                if key in REMOTE_CODE_KEYS:
                    raise ModelError(f"{name} has {key!r}: the model needs remote code; refused, never executed")
                stack.append(value)
        elif isinstance(node, list):
            stack.extend(node)


@lru_cache(maxsize=1)
def task_architectures() -> dict[str, dict[str, str]]:
    """transformers' model_type -> class-name tables for the two tasks.

    Read from transformers' installed source as data rather than imported: importing any
    transformers auto module imports torch, and the web process must not.
    """
    wanted = {"MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES": "sequence-classification",
              "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES": "causal-lm"}
    tables: dict[str, dict[str, str]] = {}
    try:
        spec = importlib.util.find_spec("transformers")
        source = Path(spec.origin).parent / "models" / "auto" / "modeling_auto.py"
        tree = ast.parse(source.read_text(encoding="utf-8"))
        for node in tree.body:
            if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                    and node.targets[0].id in wanted and isinstance(node.value, ast.Call) and node.value.args):
                pairs = ast.literal_eval(node.value.args[0])
                tables[wanted[node.targets[0].id]] = {k: v for k, v in pairs if isinstance(v, str)}
    except (AttributeError, OSError, SyntaxError, TypeError, ValueError):
        tables = {}
    if set(tables) != set(wanted.values()):  # the source layout changed: import (and pay for torch)
        from transformers.models.auto import modeling_auto

        tables = {task: {k: v for k, v in getattr(modeling_auto, name).items() if isinstance(v, str)}
                  for name, task in wanted.items()}
    return tables


def _check_architecture(config: dict[str, Any], task: str) -> None:
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise ModelError("config.json has no model_type")
    table = task_architectures()[task]
    expected = table.get(model_type)
    if expected is None:
        raise ModelError(f"model_type {model_type!r} has no built-in {task} architecture in transformers "
                         "(models that need their own code are refused)")
    architectures = config.get("architectures")
    if not isinstance(architectures, list) or not architectures:
        raise ModelError(f"config.json names no architecture (expected {expected})")
    # transformers' auto classes pick the class by model_type, so a checkpoint saved as
    # another class (a causal LM for a scalar RM) would load with freshly initialised heads.
    if architectures[0] != expected:
        raise ModelError(f"architecture {architectures[0]} is not a {task} model for {model_type!r} "
                         f"(expected {expected})")


def _safetensors_files(folder: Path, *, root: Path | None) -> list[Path]:
    index = folder / SAFETENSORS_INDEX
    if index.exists() or index.is_symlink():
        data = _read_json_object(folder, SAFETENSORS_INDEX, root=root, required=True)
        weight_map = data.get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise ModelError(f"{SAFETENSORS_INDEX} has no weight_map")
        names = sorted({str(v) for v in weight_map.values()})
        files = []
        for name in names:
            file = folder / name
            if Path(name).is_absolute() or ".." in Path(name).parts:
                raise ModelError(f"{SAFETENSORS_INDEX} names a shard outside the folder: {name}")
            if not name.endswith(".safetensors"):
                raise ModelError(f"{SAFETENSORS_INDEX} names a shard that is not safetensors: {name}")
            if not file.exists() and not file.is_symlink():
                raise ModelError(f"shard {name} named in {SAFETENSORS_INDEX} is missing")
            files.append(file)
    else:
        files = sorted(folder.glob("*.safetensors"), key=lambda f: f.name)
    if not files:
        if any(f.name.endswith(PICKLE_SUFFIXES) for f in folder.iterdir()):
            raise ModelError("pickle-only weights refused; convert to safetensors "
                             "(pytorch_model.bin / *.pt / *.pkl can run code when loaded)")
        raise ModelError("no *.safetensors weights in the model folder")
    resolved = []
    for file in sorted(files, key=lambda f: str(f.relative_to(folder))):
        real = _inside(file, folder, root)
        _safetensors_header(real)  # a renamed pickle or a truncated file fails here
        resolved.append(file)
    return resolved


def _safetensors_header(file: Path) -> dict[str, Any]:
    with _open_regular(file, file.name) as fh:
        size = os.fstat(fh.fileno()).st_size
        head = fh.read(8)
        if len(head) < 8:
            raise ModelError(f"{file.name} is not a safetensors file (too short)")
        (length,) = struct.unpack("<Q", head)
        if length > MAX_HEADER_BYTES or length > size - 8:
            raise ModelError(f"{file.name} is not a safetensors file (bad header length)")
        raw = fh.read(length)
    try:
        header = load_json(raw)  # what the safetensors library reads: no NaN; depth and number size bounded
    except JSONSyntaxError:
        raise ModelError(f"{file.name} is not a safetensors file (unreadable header)") from None
    except RowError as exc:
        raise ModelError(f"{file.name} has a safetensors header this server refuses: {exc.reason}") from None
    if not isinstance(header, dict):
        raise ModelError(f"{file.name} is not a safetensors file (header is not an object)")
    data_size = size - 8 - length
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        if (not isinstance(offsets, list) or len(offsets) != 2 or not all(isinstance(o, int) for o in offsets)
                or not 0 <= offsets[0] <= offsets[1] <= data_size):
            raise ModelError(f"{file.name} is not a valid safetensors file (tensor {name!r} lies outside the file)")
    return header


def _safetensors_parameter_count(file: Path) -> int | None:
    """The elements of every tensor; None when a shape is not a list of sizes or claims more
    elements than its bytes can hold (at least one bit each), so a made-up header never yields a
    count past what the file's size allows (nor past a 64-bit column)."""
    total = 0
    for name, entry in _safetensors_header(file.resolve()).items():
        if name == "__metadata__":
            continue
        shape = entry.get("shape")
        if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
            return None
        start, end = entry["data_offsets"]
        count = math.prod(shape)
        if count > 8 * (end - start):
            return None
        total += count
    return total


HEAD_NAMES = ("score", "classifier")


def _check_head(config: dict[str, Any], weights: list[Path]) -> None:
    """A scalar RM's weights must hold its classification head with one output per label
    (1 or 2 labels: one logit is the score, or the positive class of two); without it
    transformers would silently add a randomly initialised head."""
    labels = _num_labels(config) or 2  # transformers' default when the config names none
    if labels not in (1, 2):
        raise ModelError(f"config.json has {labels} labels; a scalar reward model needs 1 (the score) or 2")
    heads = {}
    for file in weights:
        for name, entry in _safetensors_header(file.resolve()).items():
            parts = name.split(".")
            if (name != "__metadata__" and parts[-1] == "weight" and isinstance(entry, dict)
                    and (parts[-2] in HEAD_NAMES or (parts[-2] == "out_proj" and "classifier" in parts))):
                heads[name] = entry.get("shape")
    if not heads:
        raise ModelError("no classification head in the weights (expected a tensor such as score.weight or "
                         "classifier.weight); transformers would add a random one")
    name, shape = sorted(heads.items())[-1]
    if not isinstance(shape, list) or not shape or shape[0] != labels:
        raise ModelError(f"the classification head {name} has shape {shape}, but config.json has {labels} "
                         f"label{'s' if labels != 1 else ''}")


def _check_chat_template(folder: Path, task: str = "causal-lm") -> None:
    """A chat template, when the folder has one, must be a Jinja template of at most
    MAX_CHAT_TEMPLATE_CHARS that parses and compiles, as transformers compiles it, and that
    renders a probe exchange within `chat.render_chat`'s bounds (`_probe_chat_template`). One
    nested deeper than jinja2's parser or compiler goes (RecursionError) is a refusal. JSON
    files that do not read are reported by check_model_folder and skipped here."""
    from jinja2 import TemplateSyntaxError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    templates = _chat_templates(folder)
    # As transformers builds it ({% break %} and {% continue %} parse); its own {% generation %} tag does not.
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    for where, template in templates:
        if not isinstance(template, str) or not template.strip():
            raise ModelError(f"the chat template in {where} is not a non-empty string")
        if len(template) > MAX_CHAT_TEMPLATE_CHARS:
            raise ModelError(f"the chat template in {where} is {len(template):,} characters long "
                             f"(at most {MAX_CHAT_TEMPLATE_CHARS:,})")
        try:
            env.compile(env.parse(template))
        except TemplateSyntaxError as exc:
            raise ModelError(f"the chat template in {where} does not parse (line {exc.lineno}: {exc.message})") from None
        except RecursionError:
            raise ModelError(f"the chat template in {where} is nested too deeply to compile") from None
        _probe_chat_template(folder, where, template, task)


def _special_tokens(folder: Path) -> dict[str, str]:
    """The tokenizer's special tokens by name (bos_token, eos_token, ...) from tokenizer_config.json."""
    try:
        data = load_json(_read_text(folder / "tokenizer_config.json", "tokenizer_config.json"), constants=True)
    except (OSError, UnicodeDecodeError, RowError, ModelError):
        return {}
    tokens = {}
    for name, value in (data.items() if isinstance(data, dict) else ()):
        if name.endswith("_token"):
            value = value.get("content") if isinstance(value, dict) else value
            if isinstance(value, str):
                tokens[name] = value
    return tokens


def _probe_chat_template(folder: Path, where: str, template: str, task: str) -> bool:
    """Render a probe exchange (bounded: `chat.render_chat`); ModelError naming the template
    when it cannot. Returns whether a causal LM's template takes a system message (always True
    for other tasks, whose prompts have none)."""
    from prblib.chat import ChatTemplateError, render_chat, system_role_supported

    special = _special_tokens(folder)
    try:
        if task == "causal-lm":
            return system_role_supported(template, special)
        render_chat(template, [{"role": "user", "content": "Which is better?"},
                               {"role": "assistant", "content": "The first."}],
                    add_generation_prompt=False, special_tokens=special)
        return True
    except ChatTemplateError as exc:
        raise ModelError(f"the chat template in {where} cannot render a prompt: {exc}") from None


def _chat_template_notes(folder: Path, task: str) -> tuple[str, ...]:
    """What the folder check says about its chat template beyond refusals (check_model_folder
    passed, so every template renders its probe)."""
    from prblib.chat import SYSTEM_FOLDED_NOTE

    notes = []
    for where, template in _chat_templates(folder):
        if isinstance(template, str) and task == "causal-lm" and not _probe_chat_template(folder, where, template,
                                                                                            task):
            notes.append(f"{where}: {SYSTEM_FOLDED_NOTE}")
    return tuple(notes)


def _chat_templates(folder: Path) -> list[tuple[str, Any]]:
    """(where, template source) of every chat template the folder holds."""
    templates: list[tuple[str, Any]] = []
    jinja_file = folder / "chat_template.jinja"
    if jinja_file.is_file():
        templates.append(("chat_template.jinja", _read_text(jinja_file, "chat_template.jinja", errors="replace")))
    for name in ("chat_template.json", "tokenizer_config.json"):
        try:
            data = load_json(_read_text(folder / name, name), constants=True)
        except (OSError, UnicodeDecodeError, RowError):
            continue
        if isinstance(data, dict) and data.get("chat_template") is not None:
            value = data["chat_template"]
            if isinstance(value, list):  # named templates: [{"name", "template"}]
                templates.extend((f"{name} ({t.get('name')})", t.get("template")) for t in value
                                 if isinstance(t, dict))
            else:
                templates.append((name, value))
    return templates


def _num_labels(config: dict[str, Any]) -> int | None:
    if isinstance(config.get("id2label"), dict):
        return len(config["id2label"])
    value = config.get("num_labels")
    return value if isinstance(value, int) else None


def _has_chat_template(folder: Path) -> bool:
    if (folder / "chat_template.jinja").is_file() or (folder / "chat_template.json").is_file():
        return True
    try:
        data = load_json(_read_text(folder / "tokenizer_config.json", "tokenizer_config.json"), constants=True)
    except (OSError, UnicodeDecodeError, RowError, ModelError):
        return False
    return isinstance(data, dict) and bool(data.get("chat_template"))
