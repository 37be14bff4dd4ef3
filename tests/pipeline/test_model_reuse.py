"""A worker keeps one loaded reward model between jobs (`pipeline.inputs.reward_model_get`) and
loads a fresh one when the kept one says it is no longer reusable (`RewardModel.reusable`)."""

import pytest

from pipeline import inputs
from prblib.rewards import base
from prblib.rewards.base import ModelSpec
from prblib.rewards.generative import GenerativeRewardModel
from prblib.llm.client import CachedBackend, OpenAIChatBackend


class Loaded:
    def __init__(self, n):
        self.n, self.closed, self.usable = n, False, True

    def reusable(self):
        return self.usable

    def close(self):
        self.closed = True


@pytest.fixture
def loads(monkeypatch):
    made = []
    monkeypatch.setattr(inputs, "_model_cache", {})
    monkeypatch.setattr(base, "load_reward_model", lambda spec: made.append(Loaded(len(made))) or made[-1])
    return made


def test_a_kept_model_is_reused_until_it_is_no_longer_reusable(loads):
    spec = ModelSpec(kind="pairwise", path="judge-model")
    first = inputs.reward_model_get(spec)
    assert inputs.reward_model_get(spec) is first and len(loads) == 1
    first.usable = False  # e.g. a time limit cancelled its endpoint backend
    second = inputs.reward_model_get(spec)
    assert (first.closed, second.n, second.closed) == (True, 1, False)
    assert inputs.reward_model_get(spec) is second and len(loads) == 2


def test_another_spec_replaces_and_frees_the_kept_model(loads):
    first = inputs.reward_model_get(ModelSpec(kind="scalar", path="a"))
    second = inputs.reward_model_get(ModelSpec(kind="scalar", path="b"))
    assert first.closed and not second.closed and len(loads) == 2


def test_a_judge_is_not_reusable_once_its_backend_was_cancelled_even_behind_a_cache(tmp_path):
    endpoint = OpenAIChatBackend("http://127.0.0.1:9", "m", timeout=1.0, max_retries=0)
    judge = GenerativeRewardModel(CachedBackend(endpoint, tmp_path))
    assert judge.reusable() is True
    endpoint.cancel()
    assert judge.reusable() is False
