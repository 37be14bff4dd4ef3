"""Policy samples for Best-of-N: sampled once per (benchmark, policy), reused by every RM.

Resumable: only items without samples are sampled again, and the LLM cache means answers
already paid for are not requested twice."""

from __future__ import annotations

from .endpoints import llm_backend
from .models import BuildStatus, PolicySample, PolicySampleSet
from .services import item_pair_input


def samples_generate(*, sample_set: PolicySampleSet) -> str:
    from .ml.bon import sample_responses

    PolicySampleSet.objects.filter(pk=sample_set.pk).update(status=BuildStatus.RUNNING, error="")
    done = set(sample_set.samples.values_list("item_id", flat=True).distinct())
    items = [item for item in sample_set.benchmark.items.order_by("position") if item.pk not in done]
    by_id = {item.source_id: item for item in items}
    try:
        backend = llm_backend(sample_set.endpoint, sample_set.model)
        requests = [{"id": item.source_id, "question": item.question,
                     "profile_texts": list(item_pair_input(item).profile)} for item in items]
        failed, reasons = {}, {}
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
    except Exception as exc:
        PolicySampleSet.objects.filter(pk=sample_set.pk).update(status=BuildStatus.FAILED, error=str(exc)[:2000])
        return BuildStatus.FAILED
    status = BuildStatus.FAILED if failed else BuildStatus.SUCCEEDED
    PolicySampleSet.objects.filter(pk=sample_set.pk).update(
        status=status, failed_items=failed,
        error=(f"{len(failed)} item(s) failed ({', '.join(f'{r} {n}' for r, n in sorted(reasons.items()))}); "
               "run again to retry them") if failed else "")
    return status


def samples_by_item(*, sample_set: PolicySampleSet) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {}
    for item_id, text in sample_set.samples.order_by("item_id", "index").values_list("item_id", "text"):
        out.setdefault(item_id, []).append(text)
    return out
