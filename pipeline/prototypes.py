"""Building P-GenRM user prototypes from a benchmark's training users (`build_prototypes`).

Who the training users are and what their signals are:
- a PersonalRewardBench import: every user of the train and val rows (HistoryRow), each row a
  (prompt, chosen, rejected) history entry; the test rows are never used;
- another pair-history benchmark: each item's user, with the history stored on their items;
- a profile-and-rubric benchmark: each item's user (or item), with its profile posts.
Repeated history entries and posts are kept once (pgenrm.build_prototypes).

Users are embedded from their raw signals, or (personas=True, the paper's way) from personas a
P-GenRM judge infers: one chain per train/val row with the user's OTHER rows as its history
(leave-one-out, at most `history_size` of them, the first in source order). `refine=True` then runs the
history-aware refinement (prblib.rewards.pgenrm.refine) over every user's pairs and stores the
refined prototypes beside the initial ones; a submission picks one with option prototype_stage.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import formats_prb
from .models import Benchmark


class PrototypesError(Exception):
    """Prototypes that cannot be built; the message is one line for the user."""


@dataclass
class PrototypesResult:
    path: Path
    users: int
    k: int
    source: str
    refined: bool
    personas: dict[str, int] = field(default_factory=dict)  # {"chains", "failed"} when inferred
    losses: list[dict[str, float]] = field(default_factory=list)


def training_users(benchmark: Benchmark) -> dict[str, dict[str, list]]:
    """{user: {"profile": [post text], "history": [{prompt, chosen, rejected}]}} (see the module docstring)."""
    users: dict[str, dict[str, list]] = {}
    rows = benchmark.history_rows.order_by("position")
    if rows.exists():
        for row in rows.iterator(chunk_size=1000):
            parsed = formats_prb.PRBRow.model_validate(row.row)
            users.setdefault(row.user_id, {"profile": [], "history": []})["history"].append(
                {"prompt": parsed.query, "chosen": parsed.chosen.content, "rejected": parsed.rejected.content})
        return users
    for item in benchmark.items.order_by("position").iterator(chunk_size=500):
        user = users.setdefault(item.user_id or item.source_id, {"profile": [], "history": []})
        user["profile"].extend(p.get("text", "") for p in item.profile if isinstance(p, dict))
        user["history"].extend(item.history or [])
    return users


def persona_inputs(users: dict[str, dict[str, list]], *, history_size: int) -> list[tuple[str, Any]]:
    """(user, PairInput) per history entry: the entry as the pair, the user's other entries as its history."""
    from prblib.rewards.base import PairInput

    inputs = []
    for user, signals in sorted(users.items()):
        history = signals["history"]
        for i, entry in enumerate(history):
            others = tuple(h for j, h in enumerate(history) if j != i)[:history_size]
            inputs.append((user, PairInput(id=f"{user}#{i}", domain="", question=entry["prompt"],
                                           chosen=entry["chosen"], rejected=entry["rejected"],
                                           history=others, user_id=user)))
    return inputs


def prototypes_build(*, benchmark: Benchmark, out: Path, k: int, seed: int = 0, k_from_variance: float | None = None,
                     retriever: Any, judge: Any = None, history_size: int = formats_prb.DEFAULT_HISTORY_SIZE,
                     refine_settings: Any = None,
                     progress: Callable[[int], None] | None = None) -> PrototypesResult:
    """Build, optionally refine, and save prototypes to `out` (see the module docstring).

    retriever: a DenseRetriever (the user embedder); judge: a loaded PGenRM to infer personas with,
    or None for raw signals; refine_settings: prototype_refine.RefineSettings to refine, or None.
    Raises PrototypesError with one line for every user-facing failure."""
    from prblib.rewards.pgenrm.model import build_prototypes, embedder_meta

    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise PrototypesError(f"--k must be at least 1, not {k}")
    users = training_users(benchmark)
    if not any(u["profile"] or u["history"] for u in users.values()):
        raise PrototypesError(f"benchmark '{benchmark.name}' has no preference signals to build prototypes from: "
                              f"every one of its {len(users)} user(s) has an empty history and profile")
    if refine_settings is not None and not any(u["history"] for u in users.values()):
        raise PrototypesError("cannot refine the prototypes: refinement needs preference pairs (a query with a "
                              "chosen and a rejected answer), and no user has one")
    personas, persona_counts = None, {}
    if judge is not None:
        inputs = persona_inputs(users, history_size=history_size)
        if not inputs:
            raise PrototypesError("inferring personas needs preference pairs (history entries), and no user has one")
        personas, persona_counts = judge.infer_personas(inputs, progress=progress)
    try:
        prototypes = build_prototypes(users, embed=retriever.embed, k=k, seed=seed, k_from_variance=k_from_variance,
                                      embedder=embedder_meta(retriever), personas=personas)
    except ValueError as exc:
        raise PrototypesError(f"cannot build prototypes from benchmark '{benchmark.name}': {exc}") from None
    losses: list[dict[str, float]] = []
    if refine_settings is not None:
        losses = _refine(prototypes, retriever, refine_settings)
    out.parent.mkdir(parents=True, exist_ok=True)
    prototypes.save(out)
    return PrototypesResult(path=out, users=len(prototypes.user_ids), k=prototypes.k, source=prototypes.source,
                            refined=prototypes.refined is not None, personas=persona_counts, losses=losses)


def _refine(prototypes: Any, retriever: Any, settings: Any) -> list[dict[str, float]]:
    """Refine in place from every kept user's stored history pairs; returns the per-epoch losses."""
    import numpy as np

    from prblib.rewards.pgenrm.refine import UserPairs, refine

    histories = {row: prototypes.signals[user].get("history") or [] for row, user in enumerate(prototypes.user_ids)}
    texts = [h[key] for history in histories.values() for h in history for key in ("prompt", "chosen", "rejected")]
    vectors = np.asarray(retriever.embed(texts), dtype=np.float32).reshape(-1, 3, prototypes.dim)  # one call
    pairs, start = {}, 0
    for row, history in histories.items():
        if history:
            block = vectors[start:start + len(history)]
            pairs[row] = UserPairs(queries=block[:, 0], chosen=block[:, 1], rejected=block[:, 2])
            start += len(history)
    try:
        refined, log = refine(prototypes.centroids, prototypes.labels, prototypes.embeddings, pairs, settings)
    except ValueError as exc:
        raise PrototypesError(f"cannot refine the prototypes: {exc}") from None
    prototypes.refined = refined
    prototypes.refinement = log
    return log["losses"]
