"""Correlations use one protocol at a time and say which (issue 27, item 4)."""

import pytest
from django.urls import reverse

from leaderboard import services
from tests.leaderboard.test_protocols import run_to_the_end, submit, world  # noqa: F401 (the fixture)

pytestmark = pytest.mark.django_db


def test_correlations_keep_one_protocol_at_a_time(world, client):
    """A release figure is never correlated against a prbench one (issue 27, item 4)."""
    from django.core.management import call_command

    from leaderboard.models import DownstreamOutcome
    from leaderboard.selectors import correlation_report

    released, ours = submit(world, "judge as released", {"protocol": "release"}), submit(world, "judge, our rules")
    for submission in (released, ours):
        run_to_the_end(submission)
        assert services.submission_publish(user=world, submission=submission)
    for submission, protocol, value in ((released, "release", 1.25), (ours, "prbench", 0.75)):
        DownstreamOutcome.objects.create(rm_name=submission.display_name, submission=submission, kind="best_of_n",
                                         setting="no_profile", k=16, outcome=value, n=3, config_key=protocol,
                                         manifest={"protocol": protocol})
    for protocol, submission, value in (("release", released, 1.25), ("prbench", ours, 0.75)):
        report = correlation_report(kind="best_of_n", k=16, protocol=protocol)
        assert report["outcome"]["protocol"] == protocol
        [row] = [r for r in report["correlations"] if r["benchmark"] == "protocols"]
        assert [(p["key"], p["outcome"]) for p in row["points"]] == [(f"submission:{submission.pk}", value)]
    assert client.get("/api/correlations/?protocol=release").json()["outcome"]["protocol"] == "release"
    refused = client.get("/api/correlations/?protocol=both")
    assert refused.status_code == 400 and "one protocol at a time" in refused.json()["protocol"][0]
    page = client.get(reverse("leaderboard:correlations") + "?protocol=release").content.decode()
    assert 'id="correlation-protocol"' in page and "Protocol <strong>release</strong>" in page
    call_command("correlate", "--protocol", "release", "--format", "json")
