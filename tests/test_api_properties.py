"""Property tests per JSON endpoint (issue 10): arbitrary JSON bodies get a 2xx or a 4xx with a
reason, never a 500 and never a partial write."""

import json

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from rest_framework.test import APIClient

from annotation.models import Assignment, Campaign, Rating
from annotation.services.campaigns import campaign_create
from leaderboard.models import Submission
from pipeline.models import BuildRun
from pipeline.services import benchmark_import
from tests.pipeline.test_formats import SAMPLE

pytestmark = pytest.mark.django_db

FUZZ = settings(max_examples=40, deadline=None, derandomize=True, database=None,
                suppress_health_check=list(HealthCheck))
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3),
    max_leaves=8)
ENDPOINTS = {
    "/api/annotation/ratings/": ("annotator", ["assignment", "ratings", "seconds", "comment", "flag_reason"]),
    "/api/annotation/skip/": ("annotator", ["assignment", "reason", "flag"]),
    "/api/annotation/campaigns/": ("staff_user", ["benchmark", "overlap", "guidelines", "name", "dimensions",
                                                  "target_per_annotator", "lease_minutes", "rubric_min_diff",
                                                  "other_max_diff", "gold"]),
    "/api/submissions/": ("researcher", ["display_name", "benchmark", "kind", "settings", "model_path",
                                         "judge_backend", "dtype", "max_length", "batch_size", "profile_k",
                                         "options", "parameters", "license", "link"]),
    "/api/builds/": ("staff_user", ["name", "source_path", "generator_model", "generator", "planner",
                                    "planner_model", "domains", "split", "limit", "profile_k", "retriever",
                                    "temperature", "seed"]),
}
GOOD = {"benchmark": "sample", "kind": "scores", "settings": ["profile"], "ratings": {}, "overlap": 1}
FULL = {"factuality": 4, "relevance": 5, "helpfulness": 4, "personal_rubrics": 5}
# A valid body per endpoint (where JSON alone can make one); fuzzing replaces some of its keys.
VALID = {
    "/api/annotation/ratings/": lambda token: {"assignment": token, "seconds": 3,
                                               "ratings": {"1": FULL, "2": {**FULL, "personal_rubrics": 1}}},
    "/api/annotation/skip/": lambda token: {"assignment": token, "reason": "unclear"},
    "/api/annotation/campaigns/": lambda token: {"benchmark": "sample", "overlap": 1, "guidelines": "g"},
}


def counts():
    return (Rating.objects.count(), Campaign.objects.count(), Submission.objects.count(), BuildRun.objects.count(),
            Assignment.objects.filter(status=Assignment.Status.SKIPPED).count())


@pytest.fixture
def token(staff_user, annotator):
    benchmark_import(path=SAMPLE, name="sample")
    campaign = campaign_create(user=staff_user, benchmark="sample", guidelines="g", overlap=2)
    client = APIClient()
    client.force_authenticate(annotator)
    return client.get(f"/api/annotation/next/?campaign={campaign.pk}").json()["assignment"]


@pytest.mark.parametrize("url", list(ENDPOINTS))
def test_arbitrary_json_bodies_get_a_reason_never_a_500(url, token, request):
    role, keys = ENDPOINTS[url]
    client = APIClient()
    client.force_authenticate(request.getfixturevalue(role))
    value = json_values | st.sampled_from([token, *GOOD.values()])
    fuzzed = st.fixed_dictionaries({}, optional={key: value for key in keys})
    bodies = fuzzed | json_values
    if url in VALID:
        bodies = bodies | fuzzed.map(lambda changes: {**VALID[url](token), **changes})
    seen = {"requests": 0, "2xx": 0}

    @FUZZ
    @given(body=bodies)
    def post(body):
        before = counts()
        response = client.post(url, json.dumps(body), content_type="application/json")
        seen["requests"] += 1
        assert response.status_code < 500, (body, response.content[:300])
        if response.status_code >= 400:
            reply = response.json()
            assert reply and all(reply.values()), reply  # names the field or gives a detail
            assert counts() == before  # nothing written
        else:
            seen["2xx"] += 1

    post()
    print(f"{url}: {seen['requests']} bodies, {seen['2xx']} accepted, 0 server errors")
