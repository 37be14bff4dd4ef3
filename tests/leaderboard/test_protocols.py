"""A result's protocol on the platform (issue 27): chosen per submission (`options.protocol`), stored
with the run (metrics and manifest), shown beside the number on the leaderboard, the model page and
the submission page with a one-line definition, and, for a pairwise judge under "release", the
strict figure beside the release-comparable one. The same model may hold one result per protocol."""

import csv
import io

import pytest
from django.urls import reverse

from leaderboard import services
from leaderboard.services.submissions import SubmissionRefused
from prblib import registry
from pipeline.models import LLMEndpoint
from pipeline.services import benchmark_import
from tests.prblib.test_protocols import N_PAIRS, independent_pairwise, responder, rows
from tests.pipeline.test_formats import write_jsonl

pytestmark = pytest.mark.django_db


@pytest.fixture
def world(researcher, fake_openai, tmp_path):
    benchmark_import(path=write_jsonl(tmp_path / "mixed.jsonl", rows()), name="protocols")
    fake_openai.responder = responder
    LLMEndpoint.objects.create(name="judge", base_url=fake_openai.base_url, max_retries=0)
    return researcher


def submit(user, name: str, options: dict | None = None, settings=("no_profile",)):
    return services.submission_create(user=user, request=services.SubmissionRequest(
        display_name=name, benchmark="protocols", kind="pairwise", settings=settings, judge_backend="judge",
        model_path="judge-model", options=options))


def run_to_the_end(submission):
    run = submission.runs.get()
    assert services.run_execute(run_id=run.pk) == "SUCCEEDED", run.error
    run.refresh_from_db()
    return run


def test_a_release_run_stores_its_protocol_and_shows_both_figures(world, client):
    expected, unread, strict, _ = independent_pairwise()
    released = submit(world, "judge as released", {"protocol": "release"})
    ours = submit(world, "judge, our rules")  # the same model: one result per protocol, not a duplicate
    run, our_run = run_to_the_end(released), run_to_the_end(ours)
    for submission in (released, ours):
        assert services.submission_publish(user=world, submission=submission)

    assert run.metrics["accuracy"] == expected
    assert run.metrics["protocol"]["strict_accuracy"] == strict and run.metrics["protocol"]["parse_failures"] == unread
    assert run.metrics["manifest"]["protocol"] == "release" and our_run.metrics["manifest"]["protocol"] == "prbench"
    assert released.options == {"protocol": "release"}
    assert run.fingerprint != our_run.fingerprint

    page = client.get(reverse("home")).content.decode()
    release_line = registry.kind("pairwise").protocol_definition("release")
    assert f'title="{release_line}">release</span>' in page.replace("&#x27;", "'")
    assert f"strict {100 * strict:.1f}" in page and "strict" not in page.split(">judge, our rules<")[1].split("</tr>")[0]

    for url in (reverse("leaderboard:model", args=[released.pk]), reverse("leaderboard:submission", args=[released.pk])):
        html = client.get(url).content.decode().replace("&#x27;", "'")
        assert release_line in html
        assert (f"release-comparable accuracy {100 * expected:.1f}% (an unreadable verdict counted as A, as released);"
                in html)
        assert f"strict {100 * strict:.1f}%" in html and f"{unread} unreadable verdicts of {N_PAIRS}." in html
    ours_html = client.get(reverse("leaderboard:model", args=[ours.pk])).content.decode().replace("&#x27;", "'")
    assert registry.kind("pairwise").protocol_definition("prbench") in ours_html

    api = client.get("/api/leaderboard/?benchmark=protocols").json()
    by_name = {row["display_name"]: row for row in api}
    assert by_name["judge as released"]["protocol"] == "release"
    assert by_name["judge as released"]["strict_accuracy"] == strict
    assert by_name["judge as released"]["protocol_definition"] == release_line
    assert by_name["judge, our rules"]["protocol"] == "prbench" and by_name["judge, our rules"]["strict_accuracy"] is None

    exported = client.get(reverse("leaderboard:leaderboard-export", args=["csv"]) + "?benchmark=protocols")
    table = {r["display_name"]: r for r in csv.DictReader(io.StringIO(b"".join(exported).decode()))}
    assert table["judge as released"]["protocol"] == "release"
    assert table["judge, our rules"]["protocol"] == "prbench"


def test_release_in_a_setting_the_release_has_no_counterpart_for_is_refused(world):
    with pytest.raises(SubmissionRefused) as exc:
        submit(world, "judge with profile", {"protocol": "release"}, settings=("no_profile", "profile"))
    assert exc.value.field == "settings"
    assert str(exc.value) == ("Protocol 'release' shows the model only the question, as the authors' scripts do (they "
                              "have no profile or plan evaluation): run it in the no_profile setting, not profile.")


def test_a_bad_protocol_is_one_line_naming_the_option(world, client):
    client.force_login(world)
    response = client.post("/api/submissions/", {
        "display_name": "x", "benchmark": "protocols", "kind": "pairwise", "settings": ["no_profile"],
        "judge_backend": "judge", "model_path": "judge-model", "options": {"protocol": "paper"}},
        content_type="application/json")
    assert response.status_code == 400
    line = "option 'protocol': Input should be 'prbench' or 'release'"
    assert response.json() == {"detail": line, "protocol": [line]}


def test_the_submit_page_lists_the_protocols(world, client):
    client.force_login(world)
    html = client.get(reverse("leaderboard:submit")).content.decode()
    assert "prbench | release" in html


def test_ranks_keep_one_protocol_at_a_time(world, client):
    """A release figure is never ranked against a prbench one (issue 27, item 4)."""
    released, ours = submit(world, "judge as released", {"protocol": "release"}), submit(world, "judge, our rules")
    for submission in (released, ours):
        run_to_the_end(submission)
        assert services.submission_publish(user=world, submission=submission)

    tables = client.get("/api/leaderboard/?benchmark=protocols&tables=true").json()
    assert [(t["setting"], t["protocol"], [r["display_name"] for r in t["rows"]]) for t in tables] == [
        ("no_profile", "prbench", ["judge, our rules"]), ("no_profile", "release", ["judge as released"])]
    assert all(r["rank"] == 1 for t in tables for r in t["rows"])  # each ranked in its own table
    page = client.get(reverse("home")).content.decode()
    assert 'data-protocol="release"' in page and "ranked within this setting and protocol" in page

