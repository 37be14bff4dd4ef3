"""The admin forms for downstream runs' knobs: anything staff type is a form error naming the
field, never a 500, and a stored run whose knobs no longer parse still has a readable page."""

import pytest

from leaderboard.models import PPORun, Submission
from pipeline.models import LLMEndpoint, PolicySampleSet
from tests.factories import BenchmarkFactory, UserFactory


@pytest.fixture
def world(db):
    benchmark = BenchmarkFactory()
    submission = Submission.objects.create(owner=UserFactory(roles=["researcher"]), display_name="rm",
                                           benchmark=benchmark, kind="scalar", weights_hash="a" * 64)
    judge = LLMEndpoint.objects.create(name="judge", base_url="http://127.0.0.1:9/v1")
    return submission, judge


def ppo_form(submission, judge, **changes):
    data = {"submission": submission.pk, "policy": "p", "policy_model": "policy", "setting": "profile",
            "judge": judge.pk, "judge_model": "grader", "steps": 4, "batch_size": 8, "response_length": 16,
            "seed": 0, "eval_fraction": 0.2, "options": "{}", "status": "PENDING", "attempts": 0,
            "progress_done": 0, "progress_total": 0}
    return {**data, **changes}


@pytest.mark.parametrize("options, message", [
    ("[1, 2]", "options must be a JSON object, not an array"),
    ('"learning_rate"', "options must be a JSON object, not a string"),
    ("5", "options must be a JSON object, not a number"),
    ('{"learning_rate": "fast"}', "option &#x27;learning_rate&#x27;: Input should be a valid number"),
    ('{"kl_coef": 1e999}', "The number 1e999 is out of range."),  # the JSON field's own limit (load_json)
    ('{"gamma": 1, "lam": 0.9, "url": "http://x"}', "option &#x27;url&#x27; is not an option of a ppo run"),
])
def test_bad_ppo_knobs_in_the_admin_are_a_form_error_naming_the_field(client, staff_user, world, options, message):
    client.force_login(staff_user)
    response = client.post("/admin/leaderboard/pporun/add/", ppo_form(*world, options=options))
    assert response.status_code == 200
    assert message in response.content.decode()
    assert not PPORun.objects.exists()


def test_a_stored_run_whose_knobs_do_not_parse_still_has_a_page(client, staff_user, world):
    submission, judge = world
    run = PPORun.objects.create(submission=submission, policy_model="policy", judge=judge, judge_model="g",
                                options=["not", "an", "object"])
    client.force_login(staff_user)
    response = client.get(f"/admin/leaderboard/pporun/{run.pk}/change/")
    assert response.status_code == 200
    assert "options must be a JSON object, not an array" in response.content.decode()


@pytest.mark.parametrize("changes, field_error", [
    ({"top_p": "0"}, "option &#x27;top_p&#x27;: Input should be greater than 0"),
    ({"n": "0"}, "option &#x27;n&#x27;: Input should be greater than or equal to 1"),
    ({"max_tokens": "99999999"}, "option &#x27;max_new_tokens&#x27;: Input should be less than or equal to 32768"),
])
def test_bad_sampling_knobs_in_the_admin_are_a_form_error(client, staff_user, world, changes, field_error):
    submission, _ = world
    data = {"benchmark": submission.benchmark.pk, "policy": "p", "model": "policy", "n": 4, "temperature": 0.8,
            "top_p": "", "max_tokens": 64, "seed": 0, "status": "PENDING", "attempts": 0, "progress_done": 0,
            "progress_total": 0, **changes}
    client.force_login(staff_user)
    response = client.post("/admin/pipeline/policysampleset/add/", data)
    assert response.status_code == 200
    assert field_error in response.content.decode()
    assert not PolicySampleSet.objects.exists()
