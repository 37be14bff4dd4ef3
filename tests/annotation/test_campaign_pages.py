"""Revisions and history, the shown position, position bias, the cached report, the report
command's every output mode, and the staff pages (dashboard, per-pair view, closed links)."""

import json

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.test import APIClient

from annotation.models import Assignment, Campaign, CampaignReportCache, Rating, RatingRevision
from annotation.selectors import validation_sentences
from annotation.services import reports
from annotation.services.campaigns import campaign_create, campaign_set_open
from annotation.services.errors import AnnotationError
from annotation.services.leases import assignment_next, leases_reclaim
from annotation.services.ratings import rating_revise, rating_submit
from annotation.services.reports import campaign_report, campaign_statistics
from pipeline.models import BenchmarkItem
from pipeline.services import benchmark_import
from prblib.stats import agreement as stats
from tests.factories import UserFactory
from tests.pipeline.test_formats import SAMPLE

pytestmark = pytest.mark.django_db

DIMS = ("factuality", "relevance", "helpfulness", "personal_rubrics")
GOOD = {"chosen": dict(zip(DIMS, (4, 4, 4, 5))), "rejected": dict(zip(DIMS, (4, 4, 4, 1)))}


@pytest.fixture
def campaign(staff_user):
    benchmark_import(path=SAMPLE, name="sample")
    return campaign_create(user=staff_user, benchmark="sample", guidelines="g", overlap=2)


def rate(user, campaign, chosen, rejected, seconds=20.0):
    """Rate the next pair by role (translated to the shown positions); returns the assignment."""
    assignment = assignment_next(user=user, campaign_id=campaign.pk).assignment
    shown = {"1": chosen, "2": rejected} if assignment.chosen_first else {"1": rejected, "2": chosen}
    rating_submit(user=user, token=assignment.token, ratings=shown, seconds=seconds)
    return assignment


def shown(assignment, chosen, rejected):
    return {"1": chosen, "2": rejected} if assignment.chosen_first else {"1": rejected, "2": chosen}


# --- revisions -------------------------------------------------------------------------------------

def test_a_revision_replaces_the_rating_keeps_the_old_one_and_the_report_uses_it(campaign, annotator):
    assignment = rate(annotator, campaign, GOOD["chosen"], GOOD["rejected"])
    before = campaign_report(campaign=campaign)
    assert before["dimensions"]["personal_rubrics"]["overall"]["mean_diff"] == 4.0
    revised = {**GOOD["chosen"], "personal_rubrics": 3}
    rating_revise(user=annotator, token=assignment.token, ratings=shown(assignment, revised, GOOD["rejected"]),
                  comment="second look")
    rating = Rating.objects.get()
    assert rating.chosen["personal_rubrics"] == 3 and rating.comment == "second look" and rating.revised_at
    old = RatingRevision.objects.get()
    assert old.chosen["personal_rubrics"] == 5 and old.rating == rating
    after = campaign_report(campaign=campaign)
    assert after["dimensions"]["personal_rubrics"]["overall"]["mean_diff"] == 2.0  # 3 - 1, the latest
    assert after["campaign"]["ratings"] == 1


def test_revisions_are_refused_for_other_people_and_closed_campaigns(campaign, annotator):
    assignment = rate(annotator, campaign, GOOD["chosen"], GOOD["rejected"])
    other = UserFactory(roles=["annotator"])
    with pytest.raises(AnnotationError) as missing:
        rating_revise(user=other, token=assignment.token, ratings=shown(assignment, **GOOD))
    assert missing.value.status == 404
    with pytest.raises(AnnotationError) as bad:
        rating_revise(user=annotator, token=assignment.token,
                      ratings={"1": {**GOOD["chosen"], "relevance": 9}, "2": GOOD["rejected"]})
    assert bad.value.status == 400 and bad.value.field == "ratings.1.relevance"
    campaign_set_open(campaign=campaign, is_open=False)
    with pytest.raises(AnnotationError) as closed:
        rating_revise(user=annotator, token=assignment.token, ratings=shown(assignment, **GOOD))
    assert closed.value.status == 409 and "closed" in str(closed.value)
    assert not RatingRevision.objects.exists()


def test_the_history_page_lists_own_ratings_by_position_and_the_revise_form_saves(client, campaign, annotator):
    assignment = rate(annotator, campaign, GOOD["chosen"], GOOD["rejected"])
    other = UserFactory(roles=["annotator"])
    rate(other, campaign, GOOD["chosen"], GOOD["rejected"])
    client.force_login(annotator)
    page = client.get(f"/annotate/{campaign.pk}/history/")
    html = page.content.decode()
    assert page.status_code == 200 and html.count(f"/annotate/{campaign.pk}/history/") == 1  # only their one row
    first = shown(assignment, **GOOD)["1"]
    assert " · ".join(str(first[d]) for d in DIMS) in html
    assert "chosen" not in html.lower() and "rejected" not in html.lower()
    form = client.get(f"/annotate/{campaign.pk}/history/{assignment.token}/")
    assert form.status_code == 200 and "chosen" not in form.content.decode().lower()
    post = {f"r{r}-{d}": 3 for r in "12" for d in DIMS}
    response = client.post(f"/annotate/{campaign.pk}/history/{assignment.token}/", post | {"comment": "all 3"})
    assert response.status_code == 302 and response["Location"] == f"/annotate/{campaign.pk}/history/"
    rating = Rating.objects.get(annotator=annotator)
    assert rating.chosen == rating.rejected == dict.fromkeys(DIMS, 3) and rating.comment == "all 3"
    bad = client.post(f"/annotate/{campaign.pk}/history/{assignment.token}/", {**post, "r1-relevance": "9"})
    assert bad.status_code == 400 and "ratings.1.relevance: must be a whole number from 1 to 5." in bad.content.decode()
    # Someone else's token is a 404 page.
    client.force_login(other)
    assert client.get(f"/annotate/{campaign.pk}/history/{assignment.token}/").status_code == 404


# --- shown position and position bias --------------------------------------------------------------

def test_the_export_says_where_each_answer_was_shown(client, campaign, annotator, staff_user):
    assignment = rate(annotator, campaign, GOOD["chosen"], GOOD["rejected"])
    client.force_login(staff_user)
    rows = [json.loads(line) for line in b"".join(
        client.get(f"/annotation/campaigns/{campaign.pk}/ratings.jsonl").streaming_content).decode().splitlines()]
    chosen_position = 1 if assignment.chosen_first else 2
    assert {r["position"] for r in rows if r["role"] == "chosen"} == {chosen_position}
    assert {r["position"] for r in rows if r["role"] == "rejected"} == {3 - chosen_position}
    header = b"".join(client.get(f"/annotation/campaigns/{campaign.pk}/ratings.csv").streaming_content) \
        .decode().splitlines()[0]
    assert header == "annotator,pair,domain,role,dimension,value,position,seconds,comment,flag_reason,created_at," \
                     "revised_at"


def _rows(annotator, pair, chosen_first, chosen, rejected):
    out = []
    for role, value in (("chosen", chosen), ("rejected", rejected)):
        position = 1 if (role == "chosen") == chosen_first else 2
        out.append({"annotator": annotator, "pair": pair, "domain": "d", "role": role, "dimension": "helpfulness",
                    "value": value, "position": position})
    return out


def test_position_bias_is_half_the_gap_between_the_two_orders():
    # Annotator a: chosen first -> diffs 3 and 3; chosen second -> diffs 1 and 1. b = (3 - 1) / 2 = 1.
    rows = (_rows("a", "p1", True, 5, 2) + _rows("a", "p2", True, 4, 1) + _rows("a", "p3", False, 3, 2)
            + _rows("a", "p4", False, 4, 3))
    # Annotator b: no position effect (diff 2 either way); annotator c saw one order only.
    rows += _rows("b", "p1", True, 4, 2) + _rows("b", "p2", False, 5, 3) + _rows("c", "p1", True, 5, 1)
    result = stats.position_bias(rows, ["helpfulness"])
    assert result["by_annotator"]["a"]["overall"] == {"bias": 1.0, "n_chosen_first": 2, "n_chosen_second": 2}
    assert result["by_annotator"]["a"]["by_dimension"]["helpfulness"]["bias"] == 1.0
    assert result["by_annotator"]["b"]["overall"]["bias"] == 0.0
    assert result["by_annotator"]["c"]["overall"] == {"bias": None, "n_chosen_first": 1, "n_chosen_second": 0}
    # Pooled: chosen first diffs 3, 3, 2, 4 (mean 3); chosen second 1, 1, 2 (mean 4/3): (3 - 4/3) / 2.
    assert result["overall"]["bias"] == pytest.approx((3 - 4 / 3) / 2)
    assert stats.position_bias([], ["helpfulness"]) == {
        "overall": {"bias": None, "n_chosen_first": 0, "n_chosen_second": 0}, "by_annotator": {}}


# --- cached report --------------------------------------------------------------------------------

def test_the_cached_report_equals_a_full_recomputation_and_follows_new_ratings(campaign, django_assert_max_num_queries):
    users = [UserFactory(roles=["annotator"]) for _ in range(3)]
    for i, user in enumerate(users):
        for n in range(4):
            rate(user, campaign, {**GOOD["chosen"], "helpfulness": 3 + (n + i) % 3}, GOOD["rejected"], seconds=10 + n)
    first = campaign_report(campaign=campaign)
    assert first["campaign"]["ratings"] == 12
    assert {k: v for k, v in first.items() if k != "campaign"} == campaign_statistics(campaign=campaign)
    cache = CampaignReportCache.objects.get(campaign=campaign)
    assert len(cache.key) == 64 and json.loads(cache.statistics) == {k: v for k, v in first.items() if k != "campaign"}
    # A cache hit: the ratings' counts, the gold pairs, the raters, the cache, the assignment
    # counts, the benchmark, the pairs; no rating rows.
    with django_assert_max_num_queries(7):
        assert campaign_report(campaign=campaign) == first
    # A new rating and a revision each invalidate it; the numbers stay those of a full recomputation.
    late = UserFactory(roles=["annotator"])
    assignment = rate(late, campaign, GOOD["chosen"], {**GOOD["rejected"], "personal_rubrics": 4})
    second = campaign_report(campaign=campaign)
    assert second["campaign"]["ratings"] == 13 and second != first
    assert {k: v for k, v in second.items() if k != "campaign"} == campaign_statistics(campaign=campaign)
    rating_revise(user=late, token=assignment.token, ratings=shown(assignment, **GOOD))
    third = campaign_report(campaign=campaign)
    assert third["dimensions"] != second["dimensions"]
    assert {k: v for k, v in third.items() if k != "campaign"} == campaign_statistics(campaign=campaign)
    # Changing a threshold is a different report too.
    Campaign.objects.filter(pk=campaign.pk).update(rubric_min_diff=4.5)
    campaign.refresh_from_db()
    assert campaign_report(campaign=campaign)["validation"]["rubric_min_diff"] == 4.5


def _fresh(campaign):
    """A full recomputation, as JSON text: equal text means equal numbers in the same order."""
    return json.dumps(campaign_statistics(campaign=campaign))


def _served(campaign):
    return json.dumps({k: v for k, v in campaign_report(campaign=campaign).items() if k != "campaign"})


def test_the_cached_report_follows_gold_edits_renames_and_revisions_committed_out_of_order(campaign):
    """Each change below left the cache serving the earlier numbers when its key held only the
    rating count, the newest rating id and the newest revision time. Compared as JSON text, so
    on PostgreSQL the cached mappings must also keep a fresh computation's key order (jsonb
    sorted them: dimensions came back as relevance, factuality, ...)."""
    a, b = UserFactory(roles=["annotator"], username="ann-a"), UserFactory(roles=["annotator"], username="ann-b")
    rated = [rate(user, campaign, GOOD["chosen"], GOOD["rejected"]) for user in (a, b) for _ in range(3)]
    assert _served(campaign) == _fresh(campaign)
    before = campaign_report(campaign=campaign)
    assert list(before["dimensions"]) == list(DIMS) and before["annotators"]["ann-a"]["gold"] is None
    # Staff mark a rated pair as gold in the admin.
    campaign.pairs.filter(pk=rated[0].pair_id).update(
        is_gold=True, gold_expected={"chosen": dict(zip(DIMS, (1, 1, 1, 1))), "rejected": dict(zip(DIMS, (5, 5, 5, 5)))})
    served = campaign_report(campaign=campaign)
    # ann-a rated it: 2 answers x 4 dimensions checked against the expected ratings.
    assert served["annotators"]["ann-a"]["gold"]["n"] == 8 and _served(campaign) == _fresh(campaign)
    # An annotator is renamed.
    type(a).objects.filter(pk=a.pk).update(username="ann-renamed")
    assert "ann-renamed" in campaign_report(campaign=campaign)["annotators"]
    assert _served(campaign) == _fresh(campaign)
    # Two revisions commit in the other order than their timestamps: the newest time stays.
    rating_revise(user=a, token=rated[0].token, ratings=shown(rated[0], **{
        "chosen": GOOD["chosen"], "rejected": {**GOOD["rejected"], "helpfulness": 2}}))
    assert _served(campaign) == _fresh(campaign)
    newest = Rating.objects.get(assignment=rated[0]).revised_at
    rating_revise(user=b, token=rated[3].token, ratings=shown(rated[3], **{
        "chosen": GOOD["chosen"], "rejected": {**GOOD["rejected"], "personal_rubrics": 5}}))
    Rating.objects.filter(assignment=rated[3]).update(revised_at=newest - timezone.timedelta(seconds=1))
    assert _served(campaign) == _fresh(campaign)


@pytest.mark.django_db(transaction=True)
def test_a_campaign_deleted_while_its_report_is_computed_still_gets_its_page(campaign, staff_user, monkeypatch):
    """The cache row is written after the statistics; a campaign deleted in between (e.g. in
    the admin) must not fail the page with a foreign-key error at commit: it is cached nothing."""
    rate(UserFactory(roles=["annotator"]), campaign, GOOD["chosen"], GOOD["rejected"])
    compute = campaign_statistics

    def compute_then_delete(*, campaign, gold_pairs=None):
        statistics = compute(campaign=campaign, gold_pairs=gold_pairs)
        Campaign.objects.filter(pk=campaign.pk).delete()
        return statistics

    monkeypatch.setattr(reports, "campaign_statistics", compute_then_delete)
    client = APIClient()
    client.force_authenticate(staff_user)
    response = client.get(f"/api/annotation/campaigns/{campaign.pk}/report/")
    assert response.status_code == 200 and response.json()["campaign"]["ratings"] == 1
    assert not Campaign.objects.filter(pk=campaign.pk).exists()
    assert CampaignReportCache.objects.count() == 0


def test_the_rating_screen_never_reads_the_cached_report(campaign, client):
    """The cached statistics grow with the pairs rated (~250 bytes of JSON a pair; 377 kB after
    1,505 pairs in benchmarks/profile_annotation.py --rated-first): a rating submit that loaded
    them with its campaign cost 14-19 CPU ms against 9. No request an annotator makes (the
    API's next, submit and skip; the rating, history and revision pages; their campaign list)
    may touch that table."""
    users = [UserFactory(roles=["annotator"]) for _ in range(2)]
    for user in users:
        rate(user, campaign, GOOD["chosen"], GOOD["rejected"])
    campaign_report(campaign=campaign)
    assert CampaignReportCache.objects.filter(campaign=campaign).exists()
    queries, _ = walk_the_rating_screen(campaign, client, rating_page=True)
    assert [q["sql"] for q in queries if "campaignreportcache" in q["sql"].lower()] == []


def walk_the_rating_screen(campaign, client, *, rating_page: bool):
    """A new annotator's day, every statement captured: `next` (twice: the live lease again),
    a submit, `next` and a skip, `next` and that lease expired, reclaimed and renewed; the
    rating and revision pages (when `rating_page`: both render the guidelines), the history and
    campaign-list pages, and a revision. Returns (the captured queries, the annotator)."""
    annotator = UserFactory(roles=["annotator"])
    api = APIClient()
    api.force_authenticate(annotator)
    client.force_login(annotator)
    with CaptureQueriesContext(connection) as queries:
        body = api.get("/api/annotation/next/", {"campaign": campaign.pk}).json()
        assert body["question"] and len(body["responses"]) == 2 and body["profile"] and body["rubric"]
        assert api.get("/api/annotation/next/", {"campaign": campaign.pk}).json() == body  # the live lease again
        assert api.post("/api/annotation/ratings/", {"assignment": body["assignment"], "ratings": {
            "1": GOOD["chosen"], "2": GOOD["rejected"]}, "seconds": 4}, format="json").status_code == 201
        skipped = api.get("/api/annotation/next/", {"campaign": campaign.pk}).json()["assignment"]
        assert api.post("/api/annotation/skip/", {"assignment": skipped, "reason": "unclear"},
                        format="json").status_code == 200
        lapsed = api.get("/api/annotation/next/", {"campaign": campaign.pk}).json()
        Assignment.objects.filter(token=lapsed["assignment"]).update(expires_at=timezone.now())
        assert leases_reclaim(campaign=campaign) == 1
        renewed = api.get("/api/annotation/next/", {"campaign": campaign.pk}).json()  # their expired lease, renewed
        assert renewed["assignment"] == lapsed["assignment"] and renewed["question"] == lapsed["question"]
        revise = f"/annotate/{campaign.pk}/history/{body['assignment']}/"
        pages = [f"/annotate/{campaign.pk}/history/", "/annotate/"]
        # The revision page is the rating screen itself (it renders the guidelines too).
        for url in [f"/annotate/{campaign.pk}/", revise] * rating_page + pages:
            assert client.get(url).status_code == 200, url
        form = {f"r{r}-{d}": "3" for r in "12" for d in DIMS}
        assert client.post(revise, {**form, "comment": "second look"}).status_code == 302
    assert len(queries) > 15
    return queries, annotator


# Columns no annotator request reads, written out here (not imported from selectors.UNREAD), as
# `."column"` so that a table joined under an alias (T3."narrative") is caught too: of the tables
# these requests touch, only the campaign, the campaign's pair and the item have these columns.
UNREAD_COLUMNS = ('."guidelines"', '."gold_expected"', '."narrative"', '."extra"', '."history"', '."validation"',
                  '."plan"')


def test_the_rating_screen_leaves_guidelines_gold_and_the_answer_key_in_the_database(campaign, client):
    """Guidelines run to 100,000 characters and an item's narrative, history and extra fields to
    tens of kB: a request that loaded them with its campaign or item read and parsed them on
    every `next`, submit, skip and revision, and the item's answer key has no business in an
    annotator's request at all. The rating page itself renders the guidelines (once), so it is
    left out here. The report's recomputation and the ratings export (staff) read every rating:
    they must not drag each one's item texts along."""
    Campaign.objects.filter(pk=campaign.pk).update(guidelines="Rate each answer on its own. " * 3000)
    BenchmarkItem.objects.update(narrative="The user plans every week. " * 200,
                                 extra={"notes": "x" * 5000}, plan=["Mentions routines"])
    queries, annotator = walk_the_rating_screen(campaign, client, rating_page=False)
    assert [q["sql"] for q in queries if any(column in q["sql"] for column in UNREAD_COLUMNS)] == []

    # The report's recomputation and the export read a rating's own columns, never its item's texts.
    api = APIClient()
    api.force_authenticate(UserFactory(is_staff=True))
    with CaptureQueriesContext(connection) as queries:
        export = api.get(f"/api/annotation/campaigns/{campaign.pk}/ratings/?format=csv")
        assert export.status_code == 200 and b"second look" in b"".join(export.streaming_content)
        assert api.get(f"/api/annotation/campaigns/{campaign.pk}/report/").json()["campaign"]["ratings"] == 1
    # Under any alias, except chosen and rejected, which a rating has too.
    item_texts = ('."question"', '."profile"', '."narrative"', '."rubric_aspects"', '."extra"', '."history"',
                  '"pipeline_benchmarkitem"."chosen"', '"pipeline_benchmarkitem"."rejected"')
    assert [q["sql"] for q in queries if any(column in q["sql"] for column in item_texts)] == []
    rating = Rating.objects.get(annotator=annotator)
    assert rating.comment == "second look" and rating.chosen == dict.fromkeys(DIMS, 3)


# --- the report command ---------------------------------------------------------------------------

@pytest.fixture
def two_rated(campaign):
    """Two annotators rate the same two pairs: one valid (rubric 5 vs 1) and one weak (2 vs 1)."""
    a, b = UserFactory(username="ann-a", roles=["annotator"]), UserFactory(username="ann-b", roles=["annotator"])
    weak = {**GOOD["chosen"], "personal_rubrics": 2}
    values = {}
    for user in (a, b):
        for n in range(2):
            assignment = assignment_next(user=user, campaign_id=campaign.pk).assignment
            chosen = values.setdefault(assignment.pair_id, GOOD["chosen"] if n == 0 else weak)
            rating_submit(user=user, token=assignment.token, ratings=shown(assignment, chosen,
                                                                           GOOD["rejected"]), seconds=30)
    assert len(values) == 2
    return campaign


def test_the_report_command_prints_text_by_default(two_rated, capsys):
    call_command("annotation_report", "--campaign", str(two_rated.pk))
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == (f"{two_rated.name} (sample): 4 ratings of 2 distinct pairs (of 30) by 2 annotators; "
                        "0 skipped, 0 flagged")
    # Both annotators agree: alpha 1; two positive differences: exact two-sided p = 2 / 2^2.
    assert lines[4] == "  personal_rubrics  chosen 3.50  rejected 1.00  diff 2.50  Wilcoxon p=0.5000  alpha=1.00  (n=2 pairs)"
    assert lines[1] == "  factuality        chosen 4.00  rejected 4.00  diff 0.00  Wilcoxon p=-  alpha=-  (n=2 pairs)"
    assert lines[5] == "  valid pairs: 1, invalid: 1"


def test_the_report_command_prints_json_and_records_verdicts_in_either_mode(two_rated, capsys):
    call_command("annotation_report", "--campaign", str(two_rated.pk), "--format", "json")
    report = json.loads(capsys.readouterr().out)
    assert report["campaign"]["ratings"] == 4 and report["n_pairs"] == 2 and "position_bias" in report
    call_command("annotation_report", "--campaign", str(two_rated.pk), "--format", "text", "--record-validation")
    assert capsys.readouterr().out.splitlines()[-1] == "  recorded on the benchmark: 1 valid, 1 invalid"
    call_command("annotation_report", "--campaign", str(two_rated.pk), "--format", "json", "--record-validation")
    assert json.loads(capsys.readouterr().out)["recorded"] == {"valid": 1, "invalid": 1}
    with pytest.raises(CommandError, match="no campaign with id 99999"):
        call_command("annotation_report", "--campaign", "99999")


# --- validation in words, and where verdicts show ------------------------------------------------

def test_validation_reasons_read_as_sentences(campaign):
    pair = {"diffs": {"factuality": 0.0, "relevance": None, "helpfulness": -1.5, "personal_rubrics": 1.5}}
    assert validation_sentences(pair=pair, campaign=campaign) == [
        "Relevance: not yet rated on both answers.",
        "Helpfulness: the answers differ by 1.50 points (the rejected one rated higher); a valid pair differs by "
        "less than 1 here.",
        "Personal Rubrics: the chosen answer is rated 1.50 points above the rejected one; a valid pair needs at "
        "least 2.",
    ]


def test_recorded_verdicts_show_in_the_benchmark_browser(client, two_rated, staff_user):
    client.force_login(staff_user)
    response = client.post(f"/annotation/campaigns/{two_rated.pk}/validate/", follow=True)
    assert "Recorded 1 valid and 1 invalid pairs on sample" in response.content.decode()
    invalid = BenchmarkItem.objects.get(validation__valid=False)
    page = client.get(invalid.get_absolute_url()).content.decode()
    assert "human validation: invalid" in page
    assert ("Personal Rubrics: the chosen answer is rated 1.00 points above the rejected one; a valid pair needs "
            "at least 2.") in page


# --- staff pages ----------------------------------------------------------------------------------

def test_the_dashboard_shows_every_campaign_with_progress_people_and_leases(client, two_rated, staff_user):
    closed = campaign_create(user=staff_user, benchmark="sample", guidelines="g", name="Old pilot")
    campaign_set_open(campaign=closed, is_open=False)
    holder = UserFactory(username="holder", roles=["annotator"])
    assignment_next(user=holder, campaign_id=two_rated.pk)
    client.force_login(staff_user)
    with CaptureQueriesContext(connection) as queries:
        html = client.get("/annotation/campaigns/").content.decode()
    # One row per campaign, without its guidelines (up to 100,000 characters each; not shown here).
    assert [q["sql"] for q in queries if '."guidelines"' in q["sql"]] == []
    assert 'href="/annotation/campaigns/"' in html and ">Campaigns</a>" in html  # in the navigation
    assert 'href="/annotation/campaigns/new/"' in html
    assert "Old pilot" in html and two_rated.name in html
    assert '<progress class="campaign-progress" max="60" value="4"' in html
    assert "4 of 60 ratings (6.7%) · 2 of 30 pairs complete" in html
    assert "ann-a: 2 · 1 min" in html and "ann-b: 2 · 1 min" in html
    assert "holder until" in html
    assert f'href="/annotation/campaigns/{two_rated.pk}/report/"' in html
    assert f'href="/annotation/campaigns/{two_rated.pk}/guidelines/"' in html
    assert f'href="/annotation/campaigns/{two_rated.pk}/ratings.csv"' in html
    assert 'data-confirm="Close' in html and 'data-confirm="Reopen' in html


def test_staff_pages_are_for_staff_only(client, two_rated, annotator):
    client.force_login(annotator)
    for url in ("/annotation/campaigns/", f"/annotation/campaigns/{two_rated.pk}/guidelines/",
                f"/annotation/campaigns/{two_rated.pk}/pairs/x/"):
        assert client.get(url).status_code == 403, url
    assert ">Campaigns</a>" not in client.get("/annotate/").content.decode()


def test_closing_from_the_dashboard_says_what_happened_and_returns_there(client, two_rated, staff_user):
    client.force_login(staff_user)
    dashboard = client.get("/annotation/campaigns/").content.decode()
    assert f'action="/annotation/campaigns/{two_rated.pk}/close/"' in dashboard
    response = client.post(f"/annotation/campaigns/{two_rated.pk}/close/", {"next": "dashboard"}, follow=True)
    assert response.redirect_chain[-1][0] == "/annotation/campaigns/"
    assert "is closed; open leases were ended" in response.content.decode()
    assert f'action="/annotation/campaigns/{two_rated.pk}/reopen/"' in response.content.decode()
    response = client.post(f"/annotation/campaigns/{two_rated.pk}/reopen/", follow=True)
    assert response.redirect_chain[-1][0] == f"/annotation/campaigns/{two_rated.pk}/report/"
    assert "is open again" in response.content.decode()


def test_close_and_reopen_are_explicit_so_a_second_press_never_flips_the_campaign_back(client, two_rated,
                                                                                        staff_user):
    client.force_login(staff_user)
    for _ in range(2):  # two staff pressing Close at the same moment: both leave it closed
        client.post(f"/annotation/campaigns/{two_rated.pk}/close/")
        two_rated.refresh_from_db()
        assert two_rated.is_open is False
    assert "was already closed" in client.post(f"/annotation/campaigns/{two_rated.pk}/close/",
                                               follow=True).content.decode()
    # The former toggle URL takes the operation explicitly, and refuses to guess it.
    refused = client.post(f"/annotation/campaigns/{two_rated.pk}/toggle/")
    assert refused.status_code == 400 and b"action=close or action=reopen" in refused.content
    client.post(f"/annotation/campaigns/{two_rated.pk}/toggle/", {"action": "close"})
    two_rated.refresh_from_db()
    assert two_rated.is_open is False
    client.post(f"/annotation/campaigns/{two_rated.pk}/toggle/", {"action": "reopen"})
    client.post(f"/annotation/campaigns/{two_rated.pk}/toggle/", {"action": "reopen"})
    two_rated.refresh_from_db()
    assert two_rated.is_open is True


def test_guidelines_can_be_edited(client, campaign, staff_user):
    client.force_login(staff_user)
    assert client.post(f"/annotation/campaigns/{campaign.pk}/guidelines/", {"guidelines": "  "}).status_code == 200
    response = client.post(f"/annotation/campaigns/{campaign.pk}/guidelines/", {"guidelines": "# New\nRead twice."})
    assert response.status_code == 302
    campaign.refresh_from_db()
    assert campaign.guidelines == "# New\nRead twice."


def test_the_report_counts_ratings_and_pairs_apart_and_links_failing_pairs(client, two_rated, staff_user):
    client.force_login(staff_user)
    html = client.get(f"/annotation/campaigns/{two_rated.pk}/report/").content.decode()
    assert "4 ratings of 2 distinct pairs" in html
    failing = next(p for p in campaign_report(campaign=two_rated)["validation"]["pairs"] if not p["valid"])
    assert f'href="/annotation/campaigns/{two_rated.pk}/pairs/{failing["pair"]}/"' in html
    assert "the chosen answer is rated 1.00 points above the rejected one" in html
    assert "<dt>Confidence intervals</dt>" in html and "<dt>Zero differences</dt>" in html
    assert "<dt>Ci</dt>" not in html and "<dt>Position bias</dt>" in html
    assert 'data-confirm="Write the verdicts of 2 rated pairs' in html and 'data-confirm="Close this campaign?' in html


def test_the_pair_view_shows_every_annotator_side_by_side_and_highlights_disagreement(client, campaign, staff_user):
    a, b = UserFactory(username="ann-a", roles=["annotator"]), UserFactory(username="ann-b", roles=["annotator"])
    first = rate(a, campaign, GOOD["chosen"], GOOD["rejected"])
    second = rate(b, campaign, {**GOOD["chosen"], "personal_rubrics": 2}, GOOD["rejected"])
    assert first.pair_id == second.pair_id  # b is offered the pair closest to completion
    client.force_login(staff_user)
    html = client.get(f"/annotation/campaigns/{campaign.pk}/pairs/{first.pair.item.source_id}/").content.decode()
    assert "ann-a" in html and "ann-b" in html
    assert html.count('class="disagree"') == 2  # Personal Rubrics of the chosen answer: 5 vs 2, both rows
    assert "annotators differ by 3" in html
    assert client.get(f"/annotation/campaigns/{campaign.pk}/pairs/nope/").status_code == 404


def test_a_closed_campaigns_link_shows_the_apps_page(client, campaign, annotator):
    campaign_set_open(campaign=campaign, is_open=False)
    client.force_login(annotator)
    response = client.get(f"/annotate/{campaign.pk}/")
    html = response.content.decode()
    assert response.status_code == 410 and "is closed" in html and 'href="/annotate/"' in html
    assert client.get("/annotate/999999/").status_code == 404


def test_seed_demo_gives_the_campaign_ratings_from_two_demo_annotators(settings):
    settings.DEBUG = True
    call_command("seed_demo")
    campaign = Campaign.objects.get()
    by = dict(Rating.objects.filter(campaign=campaign).values_list("annotator__username").annotate(
        n=__import__("django.db.models", fromlist=["Count"]).Count("pk")))
    assert by == {"demo-annotator-1": 30, "demo-annotator-2": 30}  # every pair of the 30-pair sample, by both
    report = campaign_report(campaign=campaign)
    assert report["n_annotators"] == 2 and report["validation"]["valid"] > 0
    call_command("seed_demo")  # idempotent
    assert Rating.objects.filter(campaign=campaign).count() == 60
    assert not Assignment.objects.filter(campaign=campaign, status="leased").exists()


def test_a_long_list_of_failing_pairs_is_cut_with_a_link_to_all(client, two_rated, staff_user, monkeypatch):
    from annotation import views

    monkeypatch.setattr(views, "REPORT_FAILING_SHOWN", 0)
    client.force_login(staff_user)
    html = client.get(f"/annotation/campaigns/{two_rated.pk}/report/").content.decode()
    assert "Showing 0 of 1 failing pairs." in html and 'href="?failing=all#failing-pairs"' in html
    everything = client.get(f"/annotation/campaigns/{two_rated.pk}/report/?failing=all").content.decode()
    assert "Showing" not in everything and "the chosen answer is rated 1.00 points above" in everything


def test_the_campaign_list_says_continue_once_an_annotator_has_rated(client, campaign, annotator):
    client.force_login(annotator)
    assert ">Start rating</a>" in client.get("/annotate/").content.decode()
    rate(annotator, campaign, GOOD["chosen"], GOOD["rejected"])
    html = client.get("/annotate/").content.decode()
    assert ">Continue rating</a>" in html and ">Start rating</a>" not in html and "1 / " in html
