"""Policy samples for Best-of-N: sampled once per (benchmark, policy), reused by every RM.

A sample set is a job (jobs/services.py). Resumable: its units are each item's N samples,
unique per (set, item, index), so only items without samples are sampled again, and the LLM
cache means answers already paid for are not requested twice."""

from __future__ import annotations

from jobs.services import job_enqueue, job_execute, job_fail, job_progress

from .endpoints import llm_backend
from .ml.base import ModelError
from .models import PolicySample, PolicySampleSet
from .services import item_pair_input


def samples_enqueue(*, sample_set: PolicySampleSet) -> None:
    """Queue the sample set on a worker (its task is sent when the transaction commits)."""
    job_enqueue(sample_set)


def samples_generate(*, sample_set: PolicySampleSet) -> str:
    """Sample in this process (the command line): queue without a task, then run. Returns the
    final status."""
    job_enqueue(sample_set, send=False)
    return samples_execute(sample_set_id=sample_set.pk)


def samples_execute(*, sample_set_id: int) -> str:
    """The sampling task's body: sample every item that has no samples yet."""
    return job_execute(PolicySampleSet, sample_set_id, _sample, expected=(ModelError,))


def _sample(sample_set: PolicySampleSet) -> dict:
    from .ml.bon import sample_responses

    sample_set = PolicySampleSet.objects.select_related("benchmark", "endpoint").get(pk=sample_set.pk)
    all_items = list(sample_set.benchmark.items.order_by("position"))
    done = set(sample_set.samples.values_list("item_id", flat=True).distinct())
    items = [item for item in all_items if item.pk not in done]
    job_progress(sample_set, len(done), len(all_items))
    by_id = {item.source_id: item for item in items}
    failed: dict[str, str] = {}
    reasons: dict[str, int] = {}
    if items:
        backend = llm_backend(sample_set.endpoint, sample_set.model)
        requests = [{"id": item.source_id, "question": item.question,
                     "profile_texts": list(item_pair_input(item).profile)} for item in items]
        for source_id, outcome in sample_responses(backend, requests, n=sample_set.n,
                                                   temperature=sample_set.temperature,
                                                   max_tokens=sample_set.max_tokens, seed=sample_set.seed):
            if isinstance(outcome, Exception):
                reason = getattr(outcome, "reason", "") or "error"  # AnswerError: truncated, rate_limited, ...
                failed[source_id] = f"{reason}: {outcome}"[:500]
                reasons[reason] = reasons.get(reason, 0) + 1
                continue
            PolicySample.objects.bulk_create(
                [PolicySample(sample_set=sample_set, item=by_id[source_id], index=i, text=text)
                 for i, text in enumerate(outcome)], ignore_conflicts=True)
            done.add(by_id[source_id].pk)
            job_progress(sample_set, len(done))
    PolicySampleSet.objects.filter(pk=sample_set.pk).update(failed_items=failed)
    if failed:
        job_fail(sample_set, f"{len(failed)} item(s) failed "
                             f"({', '.join(f'{r} {n}' for r, n in sorted(reasons.items()))}); run again to retry them")
    return {}


def samples_by_item(*, sample_set: PolicySampleSet) -> dict[int, list[str]]:
    """{item id: its samples in index order}."""
    out: dict[int, list[str]] = {}
    for item_id, text in sample_set.samples.order_by("item_id", "index").values_list("item_id", "text"):
        out.setdefault(item_id, []).append(text)
    return out
