"""The correlation figures a page shows again come from the cache, and always equal a fresh
computation: the cache key is every input (issue 14, chart pages; issue 12, numbers)."""

import pytest

from pipeline import services
from prblib.stats import correlation

ACCURACY = {"a": 0.91, "b": 0.84, "c": 0.77, "d": 0.70, "e": 0.58}
OUTCOME = {"a": 1.62, "b": 1.55, "c": 1.31, "d": 1.35, "e": 1.02}


@pytest.fixture
def counted(monkeypatch):
    calls = []
    real = correlation.correlate

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(correlation, "correlate", spy)
    return calls


def test_a_repeated_correlation_is_served_from_the_cache_and_equals_a_fresh_one(counted):
    fresh = correlation.correlate(ACCURACY, OUTCOME, resamples=300, seed=3)
    first = services.correlate(ACCURACY, OUTCOME, resamples=300, seed=3)
    second = services.correlate(ACCURACY, OUTCOME, resamples=300, seed=3)
    assert first == second == fresh
    assert round(first["spearman"]["value"], 3) == 0.9
    assert len(counted) == 2  # the direct call above, then one computation for both service calls

    second["spearman"]["value"] = -1.0  # a caller changing its copy does not change the cache
    assert services.correlate(ACCURACY, OUTCOME, resamples=300, seed=3)["spearman"]["value"] == pytest.approx(0.9)


def test_any_changed_input_is_computed_again(counted):
    base = services.correlate(ACCURACY, OUTCOME, resamples=300, seed=3)
    swapped = services.correlate(ACCURACY, {**OUTCOME, "c": 1.40}, resamples=300, seed=3)
    other_seed = services.correlate(ACCURACY, OUTCOME, resamples=300, seed=4)
    cut = services.correlate(ACCURACY, OUTCOME, resamples=300, seed=3, ndcg_k=2)
    assert len(counted) == 4
    assert base["spearman"]["value"] == pytest.approx(0.9)
    assert swapped["spearman"]["value"] == pytest.approx(1.0)  # c now above d: the rankings agree
    assert other_seed == correlation.correlate(ACCURACY, OUTCOME, resamples=300, seed=4)  # its own draw
    assert cut == correlation.correlate(ACCURACY, OUTCOME, resamples=300, seed=3, ndcg_k=2)
