"""A name and a version for every fixed prompt text the platform sends to a model.

The generation templates carry `name@vN` (`generation.PromptTemplate.key`); the judges' prompts
(pairwise, pointwise, P-GenRM native and published chains, the Best-of-N / PPO rubric judge)
and the policy's prompt declare a `TextTemplate` next to their text, with the same key form.
A run's manifest records the keys of the templates it used (`pipeline.manifest.template_versions`),
so a figure can be traced to the exact words behind it.

A text changed without a new version would make two different prompts share one key:
tests/prblib/test_prompts.py pins the sha256 of every template's text per version, so such
a change fails until the version is bumped and the new hash pinned.

Plain Python: no imports from the rest of the platform (every prompt module imports this one).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass


@dataclass(frozen=True)
class TextTemplate:
    """name: a slug; version: an integer >= 1, bumped whenever any part's text changes;
    parts: the fixed texts of the prompt (system text, headings, instruction), in order."""

    name: str
    version: int
    parts: tuple[str, ...]

    def __post_init__(self) -> None:
        if not self.name or any(c.isspace() for c in self.name):
            raise ValueError(f"a prompt template needs a name without spaces, not {self.name!r}")
        if isinstance(self.version, bool) or not isinstance(self.version, int) or self.version < 1:
            raise ValueError(f"prompt template {self.name!r} needs a version that is an integer >= 1")
        if not self.parts or not all(isinstance(p, str) for p in self.parts):
            raise ValueError(f"prompt template {self.name!r} needs its texts")

    @property
    def key(self) -> str:
        """name@vN, as the generation templates write it."""
        return f"{self.name}@v{self.version}"

    @property
    def text_sha256(self) -> str:
        """sha256 (hex) of the parts joined by U+001F (a separator no prompt contains)."""
        return text_sha256(*self.parts)


def text_sha256(*parts: str) -> str:
    """sha256 (hex) of texts joined by U+001F: the fingerprint pinned per template version."""
    return hashlib.sha256("\x1f".join(parts).encode("utf-8")).hexdigest()
