"""Schemathesis against /api/schema/ (issues 10 and 33): generated requests for every operation,
valid ones and ones the schema says are invalid, as each of five roles: anonymous, annotator,
researcher, staff and a superuser. No answer may be a 500, use a status code or a Content-Type
the schema does not document, have a body or headers that break the documented schema, or
accept a request the schema calls invalid (negative_data_rejection).

positive_data_acceptance is not among the checks: some requests valid by the schema are refused
on purpose with a 400 naming the field (wrong credentials, a benchmark that does not exist), a
fact no schema can state. tests/test_schema_truth.py pins each rule these runs found.

Each role prints one line, `FUZZ | <role>: ...`: requests, positive/negative, answers by status
code, failures. Bounded in examples so that the five roles together stay near a minute in CI."""

import json
import zlib
from collections import Counter

import pytest
import schemathesis
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.wsgi import get_wsgi_application
from django.test import override_settings
from hypothesis import HealthCheck, given, seed, settings as run_settings, strategies as st
from rest_framework.authtoken.models import Token
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.core.failures import FailureGroup
from schemathesis.specs.openapi.checks import (content_type_conformance, negative_data_rejection,
                                               response_headers_conformance, response_schema_conformance,
                                               status_code_conformance)

from annotation.services.campaigns import campaign_create
from leaderboard import services
from pipeline.services import benchmark_import
from tests.factories import UserFactory
from tests.pipeline.test_formats import SAMPLE

pytestmark = pytest.mark.django_db(transaction=True)

EXAMPLES_PER_ROLE = 200
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_headers_conformance,
          response_schema_conformance, negative_data_rejection]
ROLES = {"anonymous": None, "annotator": "annotator", "researcher": "researcher", "staff": "staff_only",
         "superuser": "staff_user"}
MODES = [GenerationMode.POSITIVE, GenerationMode.NEGATIVE]


@pytest.fixture(scope="module")
def api_schema(django_db_blocker):
    """The schema as schemathesis reads it, loaded once for every role (generating it needs no
    database; with DEBUG off "localhost", schemathesis's WSGI host, must be allowed)."""
    with django_db_blocker.unblock(), override_settings(ALLOWED_HOSTS=["localhost"]):
        return schemathesis.openapi.from_wsgi("/api/schema/?format=json", get_wsgi_application())


@pytest.fixture
def staff_only(db):
    """Staff without superuser rights (conftest's staff_user is both)."""
    return UserFactory(is_staff=True)


@pytest.fixture
def world(staff_user, researcher):
    """A benchmark, a campaign, and a published submission with a finished run and no judge
    backend, so that submissions, runs and the leaderboard answer with real rows."""
    benchmark = benchmark_import(path=SAMPLE, name="sample").benchmark
    campaign_create(user=staff_user, benchmark="sample", guidelines="g", overlap=2)
    ids = benchmark.items.order_by("position").values_list("source_id", flat=True)
    lines = "".join(json.dumps({"id": i, "chosen_score": 1, "rejected_score": n % 2}) + "\n" for n, i in enumerate(ids))
    submission = services.submission_create(user=researcher, request=services.SubmissionRequest(
        display_name="uploaded", benchmark="sample", kind="scores", settings=("profile",),
        scores_file=SimpleUploadedFile("scores.jsonl", lines.encode())))
    services.run_execute(run_id=submission.runs.get().pk)
    services.submission_publish(user=researcher, submission=submission)


@pytest.mark.parametrize("role", list(ROLES))
def test_the_api_answers_as_its_schema_says_for_every_role(role, world, api_schema, request, settings, capsys):
    settings.ALLOWED_HOSTS = [*settings.ALLOWED_HOSTS, "localhost"]  # schemathesis's WSGI client
    # Generated sign-ins name unknown users, for whom Django still runs the default hasher once.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    headers = {}
    if ROLES[role]:
        user = request.getfixturevalue(ROLES[role])
        headers["Authorization"] = f"Token {Token.objects.create(user=user).key}"
    operations = [result.ok() for result in api_schema.get_all_operations()]
    statuses, modes, failures = Counter(), Counter(), []

    @seed(zlib.crc32(role.encode()))  # each role its own cases, the same on every run
    @run_settings(max_examples=EXAMPLES_PER_ROLE, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
    @given(data=st.data())
    def exercise(data):
        operation = data.draw(st.sampled_from(operations))
        mode = data.draw(st.sampled_from(MODES))
        case = data.draw(operation.as_strategy(generation_mode=mode))
        response = case.call(headers=headers)
        statuses[response.status_code] += 1
        modes[mode.value] += 1
        try:
            case.validate_response(response, checks=CHECKS, headers=headers)
        except FailureGroup as group:
            failures.extend(f"{failure.code} {operation.label} -> {response.status_code}: {failure.title}\n"
                            f"{failure.message}\n{case.as_curl_command(headers=headers)}"
                            for failure in group.exceptions)

    exercise()
    with capsys.disabled():
        print(f"\nFUZZ | {role}: {sum(statuses.values())} requests over {len(operations)} operations "
              f"({modes['positive']} positive, {modes['negative']} negative); by status "
              f"{dict(sorted(statuses.items()))}; {len(failures)} failures")
    assert sum(statuses.values()) == EXAMPLES_PER_ROLE
    assert not failures, "\n\n".join(failures[:10])
