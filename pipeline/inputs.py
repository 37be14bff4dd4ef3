"""What a reward model may see of a benchmark item, and the one loaded reward model of a process.

Plain functions over pipeline models, below `pipeline.services` (which re-exports them) so that
the modules services re-exports (`downstream`) can use them without an import circle."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from .models import BenchmarkItem

if TYPE_CHECKING:
    from prblib.rewards.base import ModelSpec, PairInput, RewardModel, ScoreInput


_model_cache: dict[tuple, Any] = {}


def item_pair_input(item: BenchmarkItem, *, row_in_domain: int | None = None) -> "PairInput":
    """What a reward model may see of an item. The narrative and rubric aspects are the
    answer key: they are not copied, and PairInput has no field that could hold them.
    `row_in_domain`: the item's row among its domain's items (`domain_rows`), when the model needs it."""
    from prblib.rewards.base import PairInput

    if item.history is not None:
        # Earlier preferences are this user's profile: shown as text to every RM kind, and as
        # structured pairs to those that use them (P-GenRM).
        profile = tuple(history_text(past) for past in item.history)
    else:
        profile = tuple(str(post.get("text", "")) for post in item.profile if isinstance(post, dict))
    return PairInput(
        id=item.source_id, domain=item.domain, question=item.question, chosen=item.chosen, rejected=item.rejected,
        profile=profile, plan=tuple(str(aspect) for aspect in item.plan), history=tuple(item.history or ()),
        user_id=item.user_id, row_in_domain=row_in_domain,
    )


def domain_rows(benchmark_id: int) -> dict[int, int]:
    """{item pk: its 0-based row among the benchmark's items of its domain, in benchmark order}:
    the row order the authors' release iterates, one subset file per domain (protocol "release")."""
    counts: dict[str, int] = {}
    rows = {}
    for pk, domain in (BenchmarkItem.objects.filter(benchmark_id=benchmark_id).order_by("position")
                       .values_list("pk", "domain").iterator(chunk_size=5000)):
        rows[pk] = counts.get(domain, 0)
        counts[domain] = rows[pk] + 1
    return rows


def item_score_input(item: BenchmarkItem, responses: Iterable[str]) -> "ScoreInput":
    """An item's question and profile (as item_pair_input shows them) with other responses to
    score, e.g. a policy's Best-of-N samples."""
    from prblib.rewards.base import ScoreInput

    pair = item_pair_input(item)
    return ScoreInput(id=str(item.pk), question=pair.question, responses=tuple(responses), profile=pair.profile,
                      plan=pair.plan)


def history_text(past: dict) -> str:
    return (f"Asked: {past.get('prompt', '').strip()} | Preferred: {past.get('chosen', '').strip()} | "
            f"Over: {past.get('rejected', '').strip()}")


def reward_model_get(spec: "ModelSpec") -> "RewardModel":
    """Load a reward model once per process; a different spec replaces (and frees) it,
    since a GPU worker holds one model at a time."""
    from prblib.rewards.base import load_reward_model

    key = (spec.kind, spec.path, spec.device, spec.dtype, spec.max_length, spec.batch_size, spec.profile_k,
           json_key(spec.options), json_key(spec.runtime))
    cached = _model_cache.get(key)
    if cached is not None and not cached.reusable():
        # e.g. its endpoint backend was cancelled (a time limit or a cancel stopped the last job):
        # it would refuse every request, so the next job gets a fresh one.
        cached.close()
        del _model_cache[key]
    if key not in _model_cache:
        for old in _model_cache.values():
            old.close()
        _model_cache.clear()
        _model_cache[key] = load_reward_model(spec)
    return _model_cache[key]


def json_key(value: Any) -> str:
    import json

    return json.dumps(value, sort_keys=True, default=str)
