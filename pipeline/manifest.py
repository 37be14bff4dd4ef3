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

LIBRARIES = ("django", "torch", "transformers", "trl", "numpy", "scipy", "scikit-learn", "safetensors", "openai",
             "celery")


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
