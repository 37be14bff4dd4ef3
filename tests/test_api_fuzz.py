"""Schemathesis against /api/schema/ (issue 10): generated requests for every operation, as an
anonymous client, an annotator and a researcher. No answer may be a 500, use a status code the
schema does not document, or have a body that violates the documented schema. Bounded in
examples so the three runs stay well under two minutes in CI."""

import pytest
import schemathesis
from django.core.wsgi import get_wsgi_application
from hypothesis import HealthCheck, given, settings as run_settings, strategies as st
from rest_framework.authtoken.models import Token
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import response_schema_conformance, status_code_conformance

from annotation import services as annotation_services
from pipeline.services import benchmark_import
from tests.pipeline.test_formats import SAMPLE

pytestmark = pytest.mark.django_db(transaction=True)

EXAMPLES_PER_ROLE = 150
CHECKS = [not_a_server_error, status_code_conformance, response_schema_conformance]


@pytest.fixture
def world(staff_user):
    benchmark_import(path=SAMPLE, name="sample")
    annotation_services.campaign_create(user=staff_user, benchmark="sample", guidelines="g", overlap=2)


@pytest.mark.parametrize("role", ["anonymous", "annotator", "researcher"])
def test_the_api_never_answers_500_or_off_schema(role, world, request, settings):
    settings.ALLOWED_HOSTS = [*settings.ALLOWED_HOSTS, "localhost"]  # schemathesis's WSGI client
    headers = {}
    if role != "anonymous":
        user = request.getfixturevalue(role)
        headers["Authorization"] = f"Token {Token.objects.create(user=user).key}"
    app = get_wsgi_application()
    schema = schemathesis.openapi.from_wsgi("/api/schema/?format=json", app)
    operations = [result.ok() for result in schema.get_all_operations()]
    counts = {"examples": 0, "server_errors": 0}

    @run_settings(max_examples=EXAMPLES_PER_ROLE, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(data=st.data())
    def exercise(data):
        operation = data.draw(st.sampled_from(operations))
        case = data.draw(operation.as_strategy())
        response = case.call(headers=headers)
        counts["examples"] += 1
        counts["server_errors"] += response.status_code >= 500
        case.validate_response(response, checks=CHECKS, headers=headers)

    exercise()
    print(f"schemathesis {role}: {counts['examples']} requests over {len(operations)} operations, "
          f"{counts['server_errors']} server errors")
    assert counts["server_errors"] == 0
