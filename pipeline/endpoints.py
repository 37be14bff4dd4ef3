"""Where model work may reach: staff-configured LLM endpoints and the roots model files live in.

Every outbound LLM call of the platform goes to an `LLMEndpoint` row chosen by name (staff
create them in the admin or with `manage.py llm_endpoint add`); a submission names an
endpoint, never a URL, an environment variable or a folder on the worker. The functions
here turn an endpoint (or a local model folder) into the trusted `ModelSpec.runtime` and
`llm.build_backend` settings, so that this is decided in one place.
"""

from __future__ import annotations

import math
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import validate_slug
from django.db import transaction

from prblib import registry
from .models import LLMEndpoint


class EndpointError(Exception):
    """An endpoint operation refused; the message is meant for the operator."""


def endpoint_get(*, name: str) -> LLMEndpoint:
    endpoint = LLMEndpoint.objects.filter(name=name, enabled=True).first()
    if endpoint is None:
        known = ", ".join(LLMEndpoint.objects.filter(enabled=True).values_list("name", flat=True)) or "none"
        raise EndpointError(f"no enabled LLM endpoint named '{name}' (configured: {known})")
    return endpoint


def endpoint_add(*, name: str, base_url: str, api_key_env: str = "", max_concurrency: int = 4,
                 timeout_seconds: int = 120, max_retries: int = 4, deadline_seconds: int = 0,
                 price_prompt_per_1k: str | float = 0,
                 price_completion_per_1k: str | float = 0, response_format: str = "json_schema",
                 token_parameter: str = "max_tokens", accepts_temperature: bool = True, accepts_seed: bool = True,
                 accepts_n: bool = True, reasoning_effort: str = "", allowed_models: list[str] | None = None,
                 replace: bool = False, caps: dict[str, Any] | None = None) -> LLMEndpoint:
    """Create (or with replace=True, update) an endpoint. EndpointError on bad values. `caps`:
    the spend caps {max_requests_per_run, max_tokens_per_run, max_cost_per_run, and the same
    per_day}, each a number >= 0 or None for no cap."""
    try:
        validate_slug(name)
    except ValidationError:
        raise EndpointError(f"endpoint name {name!r} must be letters, digits, '-' or '_'") from None
    parts = urlsplit(base_url)
    if parts.scheme not in ("http", "https") or not parts.hostname or any(c.isspace() for c in base_url):
        # Plain host names are fine (a compose service such as http://vllm:8000/v1).
        raise EndpointError(f"--base-url {base_url!r} is not an http:// or https:// URL")
    if api_key_env and not api_key_env.replace("_", "").isalnum():
        raise EndpointError(f"--api-key-env {api_key_env!r} must be an environment variable name")
    for label, value, low in (("--max-concurrency", max_concurrency, 1), ("--timeout", timeout_seconds, 1),
                              ("--max-retries", max_retries, 0), ("--deadline", deadline_seconds, 0)):
        if not low <= value <= 10_000:
            raise EndpointError(f"{label} must be between {low} and 10000, not {value}")
    prices = {}
    for label, value in (("prompt", price_prompt_per_1k), ("completion", price_completion_per_1k)):
        try:
            price = Decimal(str(value))
        except InvalidOperation:
            raise EndpointError(f"--price-{label}-per-1k {value!r} is not a number") from None
        if not price.is_finite() or price < 0 or price >= 10_000:
            raise EndpointError(f"--price-{label}-per-1k must be from 0 to 10000, not {value}")
        prices[f"price_{label}_per_1k"] = price
    formats = [value for value, _ in LLMEndpoint._meta.get_field("response_format").choices]
    if response_format not in formats:
        raise EndpointError(f"--response-format must be one of {', '.join(formats)}, not {response_format!r}")
    for label, field, value in (("--token-parameter", "token_parameter", token_parameter),
                                ("--reasoning-effort", "reasoning_effort", reasoning_effort)):
        allowed = [v for v, _ in LLMEndpoint._meta.get_field(field).choices]
        if value not in allowed:
            raise EndpointError(f"{label} must be one of {', '.join(v or repr(v) for v in allowed)}, not {value!r}")
    allowed = list(dict.fromkeys(allowed_models or ()))
    for model in allowed:
        if not isinstance(model, str) or not model.strip() or len(model) > 300 or any(c.isspace() for c in model):
            raise EndpointError(f"--model {model!r} must be a model name of 1 to 300 characters without spaces")
    checked_caps = {}
    for key, value in (caps or {}).items():
        if key not in {f"max_{m}_per_{s}" for m in SPEND_MEASURES for s in ("run", "day")}:
            raise EndpointError(f"no spend cap named {key!r}")
        if value is None or value == "":
            checked_caps[key] = None
            continue
        try:
            number = Decimal(str(value))
        except InvalidOperation:
            raise EndpointError(f"--{key.replace('_', '-')} {value!r} is not a number") from None
        if not number.is_finite() or number < 0 or number >= 10 ** 8 or ("cost" not in key and number != int(number)):
            raise EndpointError(f"--{key.replace('_', '-')} must be a {'number' if 'cost' in key else 'whole number'} "
                                f"from 0 to 99999999, not {value}")
        checked_caps[key] = number if "cost" in key else int(number)
    fields = dict(base_url=base_url, api_key_env=api_key_env, max_concurrency=max_concurrency,
                  timeout_seconds=timeout_seconds, max_retries=max_retries, deadline_seconds=deadline_seconds,
                  response_format=response_format, token_parameter=token_parameter,
                  accepts_temperature=bool(accepts_temperature), accepts_seed=bool(accepts_seed),
                  accepts_n=bool(accepts_n), reasoning_effort=reasoning_effort, allowed_models=allowed,
                  enabled=True, **prices, **checked_caps)
    with transaction.atomic():
        existing = LLMEndpoint.objects.select_for_update().filter(name=name).first()
        if existing is not None and not replace:
            raise EndpointError(f"an endpoint named '{name}' exists (use --replace to change it)")
        if existing is None:
            return LLMEndpoint.objects.create(name=name, **fields)
        for key, value in fields.items():
            setattr(existing, key, value)
        existing.save()
        return existing


def endpoint_model_refusal(endpoint: LLMEndpoint, model: str) -> str | None:
    """Why `model` may not be asked of `endpoint` by a researcher (it is not among the models
    staff allow there), or None. An endpoint without allowed_models takes any name."""
    allowed = [m for m in (endpoint.allowed_models or []) if isinstance(m, str)]
    if not allowed or model in allowed:
        return None
    return f"model '{model[:120]}' is not offered at judge backend '{endpoint.name}' (offered: {', '.join(allowed)})"


def endpoint_remove(*, name: str) -> None:
    """Delete an endpoint; one still referenced by submissions or builds is disabled instead."""
    from django.db.models.deletion import ProtectedError

    endpoint = LLMEndpoint.objects.filter(name=name).first()
    if endpoint is None:
        raise EndpointError(f"no LLM endpoint named '{name}'")
    try:
        endpoint.delete()
    except ProtectedError:
        LLMEndpoint.objects.filter(pk=endpoint.pk).update(enabled=False)
        raise EndpointError(f"endpoint '{name}' is used by existing results, so it was disabled, not deleted") \
            from None


def endpoint_runtime(endpoint: LLMEndpoint, *, model: str) -> dict[str, Any]:
    """`llm.build_backend` settings for `model` served by a staff-configured endpoint. A
    server-directed wait (Retry-After) is honoured up to settings.LLM_MAX_RETRY_WAIT seconds."""
    return {"backend": "openai", "base_url": endpoint.base_url, "model": model,
            "api_key_env": endpoint.api_key_env or None, "timeout": endpoint.timeout_seconds,
            "max_retries": endpoint.max_retries, "max_retry_wait": settings.LLM_MAX_RETRY_WAIT,
            "deadline": endpoint.deadline_seconds or 2 * endpoint.timeout_seconds,
            "concurrency": endpoint.max_concurrency,
            "price_prompt_per_1k": float(endpoint.price_prompt_per_1k),
            "price_completion_per_1k": float(endpoint.price_completion_per_1k),
            "response_format": endpoint.response_format, **endpoint_capabilities(endpoint)}


CAPABILITIES = ("token_parameter", "accepts_temperature", "accepts_seed", "accepts_n", "reasoning_effort")


def endpoint_capabilities(endpoint: LLMEndpoint) -> dict[str, Any]:
    """What the endpoint's server takes (`llm.OpenAIChatBackend` capabilities), as stored."""
    values = {name: getattr(endpoint, name) for name in CAPABILITIES}
    values["reasoning_effort"] = values["reasoning_effort"] or None
    return values


def endpoint_remember_capabilities(endpoint: LLMEndpoint | None, backend: Any) -> list[str]:
    """After a job: store on the endpoint what `backend` (built from it) learned from the server's
    400s (response_format refused, the other token parameter's name, temperature, seed, n or
    reasoning_effort refused), so later jobs do not send them again. Only a field the backend
    changed is written. Returns the names of the fields changed."""
    inner = getattr(backend, "inner", backend)
    learned = inner.capabilities() if endpoint is not None and callable(getattr(inner, "capabilities", None)) else {}
    configured = {"response_format": endpoint.response_format, **endpoint_capabilities(endpoint)} if learned else {}
    changes = {name: value for name, value in learned.items()
               if name in configured and (value or None) != (configured[name] or None)}
    if "reasoning_effort" in changes:
        changes["reasoning_effort"] = changes["reasoning_effort"] or ""
    if changes:
        LLMEndpoint.objects.filter(pk=endpoint.pk).update(**changes)
    return sorted(changes)


def endpoint_remember_json_support(endpoint: LLMEndpoint | None, backend: Any) -> bool:
    """The name this had when response_format was all it learned: `endpoint_remember_capabilities`."""
    return bool(endpoint_remember_capabilities(endpoint, backend))


def models_root_for(folder: str | Path) -> Path | None:
    """The root a model folder's files must stay inside: MODELS_ROOT, or the Hugging Face
    cache for a local Hub snapshot (only with ALLOW_HUB_MODELS). None: neither (an operator's
    own folder on the command line), and the loader confines the folder to itself."""
    resolved = Path(folder).resolve()
    if resolved.is_relative_to(settings.MODELS_ROOT):
        return settings.MODELS_ROOT
    if settings.ALLOW_HUB_MODELS:
        from huggingface_hub import constants

        cache = Path(constants.HF_HUB_CACHE).resolve()
        if resolved.is_relative_to(cache):
            return cache
    return None


def model_runtime(*, kind: str, path: str, endpoint: LLMEndpoint | None = None, cache_key: str = "",
                  benchmark_ids: list[str] | None = None) -> dict[str, Any]:
    """The trusted `ModelSpec.runtime` for a reward model: connection (endpoint or local
    folder), cache, roots, benchmark ids. Shared by the worker and `evaluate_rm`."""
    runtime: dict[str, Any] = {"data_root": str(settings.DATA_ROOT)}
    if endpoint is not None:
        runtime.update(endpoint_runtime(endpoint, model=path))
    else:
        root = models_root_for(path) if path else None
        if root is not None:
            runtime["models_root"] = str(root)
        if registry.kind(kind).generative:
            runtime["backend"] = "local"
    if registry.kind(kind).generative and cache_key:
        # Answers are cached by a hash of the call joined with cache_key (the weights hash, or the
        # endpoint and model name), so replaced weights never get another model's answers.
        runtime["cache_dir"] = str(Path(settings.VAR_DIR) / "llm-cache")
        runtime["cache_key"] = cache_key
    if benchmark_ids is not None:
        runtime["benchmark_ids"] = benchmark_ids
    return runtime


def llm_backend(endpoint: LLMEndpoint | None, model: str):
    """A cached chat backend for the pipeline (generator, planner, Best-of-N judge, policy):
    the staff endpoint's model, or a causal-LM folder under MODELS_ROOT."""
    from prblib.llm.client import build_backend
    from prblib.modelcheck import inspect_model_folder

    cache_dir = str(Path(settings.VAR_DIR) / "llm-cache")
    if endpoint is not None:
        return build_backend({**endpoint_runtime(endpoint, model=model), "cache_dir": cache_dir})
    info = inspect_model_folder(Path(settings.MODELS_ROOT) / model, models_root=Path(settings.MODELS_ROOT),
                                task="causal-lm")
    return build_backend({"backend": "local", "cache_dir": cache_dir, "cache_key": info.weights_hash,
                          "models_root": str(settings.MODELS_ROOT)}, path=info.path, device=settings.RM_DEVICE)


# --- spend caps ---------------------------------------------------------------------------------

class SpendCapReached(Exception):
    """A run refused before it starts, or stopped while it runs, at an endpoint's spend cap.
    The message says which cap, what was spent and that the pairs scored are kept. Not a
    ModelError on purpose: per-item handlers of model errors must not swallow it."""


SPEND_MEASURES = ("requests", "tokens", "cost")


def spend_caps(endpoint: LLMEndpoint) -> dict[str, dict[str, float | None]]:
    """{"run": {requests, tokens, cost}, "day": {...}}: the endpoint's caps, None where none."""
    def value(name: str) -> float | None:
        raw = getattr(endpoint, name)
        return None if raw is None else float(raw)

    return {scope: {m: value(f"max_{m}_per_{scope}") for m in SPEND_MEASURES} for scope in ("run", "day")}


def requests_per_pair(kind: str, options: dict | None) -> int:
    """Requests a generative RM of `kind` sends per pair with `options` (before retries): a
    pairwise judge 2 (both orders; 1 under protocol release or both_orders false), a pointwise
    judge 2 (one per answer), P-GenRM m + n (its resolved m chains for the user, and one chain
    for each of up to n neighbours, `pgenrm.PGenRM.judge_pair`; neighbours are used only in the
    profile setting and for a user with signals, so m + n is an upper bound)."""
    from prblib.rewards.options import parse_options

    return parse_options(kind, options or {}).requests_per_pair()


def spend_estimate(*, kind: str, options: dict | None, endpoint: LLMEndpoint,
                   texts: list[tuple[str, str, str]]) -> dict[str, float]:
    """What a run over the pairs `texts` [(question, chosen, rejected)] would spend at most:
    requests = pairs x requests_per_pair; tokens = per request the prompt (question and both
    answers, about 4 characters a token) plus the answer's whole budget (max_tokens); cost by
    the endpoint's prices per 1,000 tokens. An upper estimate of the completion side, a rough one
    of the prompt side (profiles and instructions add to it)."""
    from prblib.rewards.options import parse_options

    per_pair = requests_per_pair(kind, options)
    parsed = parse_options(kind, options or {})
    budget = parsed.answer_budget()
    prompt = sum(len(q) + len(c) + len(r) for q, c, r in texts) // 4 * per_pair
    completion = len(texts) * per_pair * budget
    cost = (prompt * float(endpoint.price_prompt_per_1k) + completion * float(endpoint.price_completion_per_1k)) / 1000
    return {"requests": len(texts) * per_pair, "tokens": prompt + completion, "cost": cost, "per_pair": per_pair,
            "prompt": prompt, "completion": completion}


def spend_charge(estimate: dict[str, float], endpoint: LLMEndpoint) -> dict[str, float]:
    """What one reply without `usage` is charged in the ledger and the cap checks: the per-request
    estimate of `spend_estimate` (tokens: the prompt estimate, rounded up, plus the whole
    max_tokens budget; cost: those tokens at the endpoint's prices per 1,000 tokens), never 0.
    Also carries the prices, with which `spend_of_usage` prices the reported tokens."""
    requests = max(1, int(estimate.get("requests") or 0))
    prompt = math.ceil(float(estimate.get("prompt", 0)) / requests)
    completion = math.ceil(float(estimate.get("completion", 0)) / requests)
    price_prompt, price_completion = float(endpoint.price_prompt_per_1k), float(endpoint.price_completion_per_1k)
    return {"tokens": float(prompt + completion),
            "cost": (prompt * price_prompt + completion * price_completion) / 1000,
            "price_prompt_per_1k": price_prompt, "price_completion_per_1k": price_completion}


def _spent_today(endpoint: LLMEndpoint, owner_id: int) -> dict[str, float]:
    from django.utils import timezone

    from .models import EndpointSpend

    row = EndpointSpend.objects.filter(endpoint=endpoint, owner_id=owner_id, day=timezone.now().date()).first()
    return {m: float(getattr(row, m)) if row else 0.0 for m in SPEND_MEASURES}


def _amount(measure: str, value: float) -> str:
    return f"{value:,.4f} in cost" if measure == "cost" else f"{int(value):,} {measure}"


def spend_refusal(*, endpoint: LLMEndpoint, owner_id: int, run: dict[str, float], estimate: bool,
                  runs: int = 1, more: bool = True, reserved: dict[str, float] | None = None) -> str | None:
    """Why a run may not go on (estimate=False: `run` is what it spent so far) or start
    (estimate=True: `run` is `spend_estimate`, for each of `runs` runs), or None: the first cap
    reached among the endpoint's per-run caps and per-day caps (this owner's spend today at the
    endpoint, from the ledger, plus `runs` times `run` when estimating, and plus `reserved`: what
    this owner's queued and running runs there would still spend, `spend_reserved`). Spending
    exactly a cap is allowed: an estimate is refused only over it; a run that spent it is stopped
    when it has `more` pairs to score (any further request would pass the cap), and after its last
    pair only when it passed the cap."""
    caps, today = spend_caps(endpoint), _spent_today(endpoint, owner_id)

    def over(value: float, cap: float) -> bool:
        return value >= cap if more and not estimate else value > cap

    for measure in SPEND_MEASURES:
        cap, value = caps["run"][measure], run.get(measure) or 0.0
        if cap is not None and over(value, cap):
            what = "would need about" if estimate else "reached"
            return (f"this run {what} {_amount(measure, value)} at judge backend '{endpoint.name}', "
                    f"{'over its' if estimate or value > cap else 'its'} cap of {_amount(measure, cap)} per run "
                    f"(max_{measure}_per_run)")
        cap = caps["day"][measure]
        day = today[measure] + (value * runs + (reserved or {}).get(measure, 0.0) if estimate else 0.0)
        if cap is not None and over(day, cap):
            queued = " with what your queued and running runs there would still spend" if estimate and (
                reserved or {}).get(measure) else ""
            return (f"your runs at judge backend '{endpoint.name}' {'would reach' if estimate else 'reached'} "
                    f"{_amount(measure, day)} today (UTC){queued}, {'over its' if estimate or day > cap else 'its'} "
                    f"cap of {_amount(measure, cap)} per researcher per day (max_{measure}_per_day)")
    return None


def spend_reserved(*, endpoint: LLMEndpoint, runs: list[tuple[str, dict | None, list[tuple[str, str, str]]]]
                   ) -> dict[str, float]:
    """{requests, tokens, cost}: what runs not finished yet would still spend at most, summed: for
    each (kind, options, texts of its pairs not scored yet), `spend_estimate`. Counted into a new
    run's per-day check, so runs queued together cannot each claim the same room under a cap."""
    total = {m: 0.0 for m in SPEND_MEASURES}
    for kind, options, texts in runs:
        if texts:
            estimate = spend_estimate(kind=kind, options=options, endpoint=endpoint, texts=texts)
            for m in SPEND_MEASURES:
                total[m] += estimate[m]
    return total


def spend_record(*, endpoint: LLMEndpoint, owner_id: int, delta: dict[str, float]) -> None:
    """Add `delta` {requests, tokens, cost} to this owner's spend today at the endpoint."""
    from django.db.models import F
    from django.utils import timezone

    from .models import EndpointSpend

    values = {m: max(0, delta.get(m) or 0) for m in SPEND_MEASURES}
    if not any(values.values()):
        return
    day = timezone.now().date()
    with transaction.atomic():
        row, _ = EndpointSpend.objects.select_for_update().get_or_create(endpoint=endpoint, owner_id=owner_id, day=day)
        EndpointSpend.objects.filter(pk=row.pk).update(**{m: F(m) + (int(v) if m != "cost" else float(v))
                                                          for m, v in values.items()})


def spend_of_usage(usage: dict | None, charge: dict[str, float] | None = None) -> dict[str, float]:
    """{requests, tokens, cost} of an RM's `usage()`. With `charge` (`spend_charge`), what the
    ledger and the cap checks count: each of `requests_without_usage` (replies whose tokens are
    unknown) is charged charge's tokens and cost, never 0, and the cost is the reported tokens at
    charge's prices plus those charges. Without it: the tokens reported, and cost 0 where unknown
    or unpriced."""
    usage = usage or {}
    prompt, completion = float(usage.get("prompt_tokens") or 0), float(usage.get("completion_tokens") or 0)
    spent = {"requests": float(usage.get("requests") or 0), "tokens": prompt + completion,
             "cost": float(usage.get("cost") or 0.0)}
    if charge is not None:
        unknown = float(usage.get("requests_without_usage") or 0)
        spent["tokens"] += unknown * charge["tokens"]
        spent["cost"] = ((prompt * charge["price_prompt_per_1k"] + completion * charge["price_completion_per_1k"])
                         / 1000 + unknown * charge["cost"])
    return spent
