"""Spend under the operator's control (issue 29, fault 12): researchers pick a model among those
staff allow at an endpoint (its key is the staff's), and option bounds no submission passes."""

import json

import pytest
from django.core.management import CommandError, call_command

from leaderboard import services
from pipeline.ml.options import OptionsError, parse_options
from pipeline.models import LLMEndpoint
from tests.leaderboard.test_submissions import sample  # noqa: F401 (a fixture)

pytestmark = pytest.mark.django_db


def judge_request(model: str, **kwargs):
    return services.SubmissionRequest(display_name=f"judge {model}", benchmark="sample", kind="pairwise",
                                      settings=("profile",), judge_backend="hosted", model_path=model, **kwargs)


def test_a_researcher_picks_among_the_models_staff_allow(researcher, sample, capsys):  # noqa: F811
    call_command("llm_endpoint", "add", "hosted", "--base-url", "https://api.example.com/v1", "--api-key-env",
                 "HOSTED_KEY", "--model", "gpt-small", "--model", "gpt-mini")
    capsys.readouterr()
    call_command("llm_endpoint", "list", "--format", "json")
    assert json.loads(capsys.readouterr().out)[0]["allowed_models"] == ["gpt-small", "gpt-mini"]
    with pytest.raises(services.SubmissionRefused) as caught:
        services.submission_create(user=researcher, request=judge_request("gpt-5-pro"))
    assert str(caught.value) == ("Model 'gpt-5-pro' is not offered at judge backend 'hosted' (offered: gpt-small, "
                                 "gpt-mini).")
    assert caught.value.field == "model_path" and caught.value.status == 400
    submission = services.submission_create(user=researcher, request=judge_request("gpt-mini"))
    assert submission.model_path == "gpt-mini"


def test_an_endpoint_without_a_list_takes_any_model(researcher, sample):  # noqa: F811
    LLMEndpoint.objects.create(name="hosted", base_url="http://127.0.0.1:9/v1")
    assert services.submission_create(user=researcher, request=judge_request("my-own-vllm-model")).pk


def test_a_bad_allowed_model_name_is_one_line():
    with pytest.raises(CommandError, match=r"^--model 'two words' must be a model name of 1 to 300 characters "
                                           r"without spaces$"):
        call_command("llm_endpoint", "add", "hosted", "--base-url", "http://x/v1", "--model", "two words")


@pytest.mark.parametrize("options,message,key", [
    ({"m": 64}, "option 'm': Input should be less than or equal to 32", "m"),
    ({"max_tokens": 1_000_000}, "option 'max_tokens': Input should be less than or equal to 32768", "max_tokens"),
])
def test_pgenrm_options_past_the_bounds_are_refused(options, message, key):
    with pytest.raises(OptionsError) as caught:
        parse_options("pgenrm", options)
    assert (str(caught.value), caught.value.key) == (message, key)
    assert parse_options("pgenrm", {"m": 32, "max_tokens": 32768}).m == 32


def test_a_pgenrm_submission_past_the_bounds_is_a_400_naming_the_option(researcher, sample):  # noqa: F811
    LLMEndpoint.objects.create(name="hosted", base_url="http://127.0.0.1:9/v1")
    request = services.SubmissionRequest(display_name="P-GenRM", benchmark="sample", kind="pgenrm",
                                         settings=("profile",), judge_backend="hosted", model_path="chains",
                                         options={"m": 64, "max_tokens": 1_000_000})
    with pytest.raises(services.SubmissionRefused) as caught:
        services.submission_create(user=researcher, request=request)
    assert (str(caught.value), caught.value.field) == ("option 'm': Input should be less than or equal to 32", "m")
