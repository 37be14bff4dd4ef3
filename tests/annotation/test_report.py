"""The campaign report (page, API, command) and recorded validation feeding exports."""

import json

import krippendorff
import numpy as np
import pytest
from django.core.management import call_command
from rest_framework.test import APIClient
from scipy import stats

from annotation.models import Assignment
from annotation.selectors import rating_rows
from annotation.services.campaigns import campaign_create
from annotation.services.leases import assignment_next
from annotation.services.ratings import rating_submit
from annotation.services.reports import campaign_report
from pipeline.services import benchmark_import
from tests.factories import UserFactory
from tests.pipeline.test_formats import SAMPLE

pytestmark = pytest.mark.django_db

DIMS = ("factuality", "relevance", "helpfulness", "personal_rubrics")


@pytest.fixture
def rated_campaign(staff_user):
    """3 annotators rate the same 6 pairs. Personal Rubrics separates chosen from rejected on
    five of them; the sixth pair the first annotator gets is made invalid (helpfulness differs
    too much, rubric gap too small)."""
    benchmark_import(path=SAMPLE, name="sample")
    campaign = campaign_create(user=staff_user, benchmark="sample", guidelines="g", overlap=3,
                               target_per_annotator=6)
    annotators = [UserFactory(roles=["annotator"]) for _ in range(3)]
    bad_pair = None
    for a_index, user in enumerate(annotators):
        for n in range(6):
            assignment = assignment_next(user=user, campaign_id=campaign.pk).assignment
            order = assignment.pair.item.position
            if a_index == 0 and n == 5:
                bad_pair = assignment.pair_id
            bad = assignment.pair_id == bad_pair
            chosen = {"factuality": 4 + (a_index == 2), "relevance": 4, "helpfulness": 5 if bad else 4,
                      "personal_rubrics": 3 if bad else 5 - (a_index == 1 and order % 2)}
            rejected = {"factuality": 4, "relevance": 4 - (a_index == 0), "helpfulness": 3 if bad else 4,
                        "personal_rubrics": 2 if bad else 1 + (a_index == 2 and order % 3 == 0)}
            first, second = (chosen, rejected) if assignment.chosen_first else (rejected, chosen)
            rating_submit(user=user, token=assignment.token, ratings={"1": first, "2": second},
                          seconds=10 + a_index)
    return campaign


def test_the_report_matches_scipy_and_krippendorff_on_the_stored_ratings(rated_campaign):
    report = campaign_report(campaign=rated_campaign)
    assert report["campaign"]["ratings"] == 18 and report["n_pairs"] == 6 and report["n_annotators"] == 3
    assert report["n_ratings"] == 18 * 8  # rating values: 2 responses x 4 dimensions per rated pair
    rows = list(rating_rows(campaign=rated_campaign))
    for dim in DIMS:
        pairs = sorted({r["pair"] for r in rows})

        def mean(pair, role):
            values = [r["value"] for r in rows if r["pair"] == pair and r["role"] == role and r["dimension"] == dim]
            return sum(values) / len(values)

        diffs = np.array([mean(p, "chosen") - mean(p, "rejected") for p in pairs])
        summary = report["dimensions"][dim]["overall"]
        assert summary["chosen_mean"] == pytest.approx(np.mean([mean(p, "chosen") for p in pairs]))
        if np.count_nonzero(diffs) >= 2:
            expected = stats.wilcoxon(diffs, zero_method="wilcox")
            assert summary["wilcoxon"]["p_value"] == pytest.approx(expected.pvalue)
        annotators = sorted({r["annotator"] for r in rows})
        units = sorted({(r["pair"], r["role"]) for r in rows})
        matrix = np.full((len(annotators), len(units)), np.nan)
        for r in rows:
            if r["dimension"] == dim:
                matrix[annotators.index(r["annotator"]), units.index((r["pair"], r["role"]))] = r["value"]
        alpha = report["agreement"][dim]["alpha"]
        if alpha is not None:
            assert alpha == pytest.approx(krippendorff.alpha(reliability_data=matrix, level_of_measurement="ordinal",
                                                             value_domain=[1, 2, 3, 4, 5]))
    rubric = report["dimensions"]["personal_rubrics"]["overall"]
    assert rubric["chosen_mean"] > 4 and rubric["rejected_mean"] < 2
    assert report["validation"]["valid"] == 5 and report["validation"]["invalid"] == 1
    json.dumps(report, allow_nan=False)


def test_recorded_validation_drives_the_validated_only_export(rated_campaign, tmp_path):
    out = tmp_path / "valid.jsonl"
    call_command("annotation_report", "--campaign", str(rated_campaign.pk), "--format", "json",
                 "--record-validation", stdout=open(tmp_path / "report.json", "w"))
    call_command("export_benchmark", "--name", "sample", "--out", str(out), "--validated-only")
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 5
    invalid = next(p for p in campaign_report(campaign=rated_campaign)["validation"]["pairs"] if not p["valid"])
    assert invalid["pair"] not in {r["id"] for r in rows}
    assert any("helpfulness" in reason for reason in invalid["reasons"])


def test_the_report_command_prints_json_with_the_figures(rated_campaign, capsys):
    call_command("annotation_report", "--campaign", str(rated_campaign.pk), "--format", "json")
    report = json.loads(capsys.readouterr().out)
    assert report["campaign"]["id"] == rated_campaign.pk and "personal_rubrics" in report["dimensions"]


def test_the_report_page_and_api_are_for_staff_only(client, rated_campaign, staff_user):
    annotator = Assignment.objects.filter(pair__campaign=rated_campaign).first().annotator
    client.force_login(annotator)
    refused = client.get(f"/annotation/campaigns/{rated_campaign.pk}/report/")
    assert refused.status_code == 403 and b"This page is for staff." in refused.content  # the app's 403, not the admin login
    api = APIClient()
    api.force_authenticate(annotator)
    assert api.get(f"/api/annotation/campaigns/{rated_campaign.pk}/report/").status_code == 403
    client.force_login(staff_user)
    page = client.get(f"/annotation/campaigns/{rated_campaign.pk}/report/")
    assert page.status_code == 200
    html = page.content.decode()
    assert 'id="chart-dimensions"' in html and "vendor/plotly/plotly.min.js" in html and 'id="failing-pairs"' in html
    api.force_authenticate(staff_user)
    assert api.get(f"/api/annotation/campaigns/{rated_campaign.pk}/report/").json()["campaign"]["ratings"] == 18


def test_the_report_page_says_every_figure_in_words_and_the_api_keeps_its_keys(client, rated_campaign, staff_user):
    """Issue 15: no raw key (d_z, default_rng, n_zero_dropped, other_max_diff, rubric_min_diff)
    in the page's text; each figure has a human label. The JSON API keeps its keys."""
    import html as html_module
    import re

    client.force_login(staff_user)
    html = client.get(f"/annotation/campaigns/{rated_campaign.pk}/report/").content.decode()
    text = re.sub(r"<script.*?</script>", "", html, flags=re.S)
    text = html_module.unescape(re.sub(r"<[^>]+>", "", text))
    for raw in ("default_rng", "n_zero_dropped", "other_max_diff", "rubric_min_diff", "'overall'"):
        assert raw not in text, raw
    assert re.findall(r"\S*d_z", text) == ["d_z"], "d_z only inside 'effect size (Cohen's d_z)'"
    assert "effect size (Cohen's d_z)" in text and "Effect size (Cohen's dz)" in text
    assert "counted as pairs with zero difference dropped" in text
    assert "numpy's seeded random generator" in text
    api = APIClient()
    api.force_authenticate(staff_user)
    report = api.get(f"/api/annotation/campaigns/{rated_campaign.pk}/report/").json()
    assert "n_zero_dropped" in report["dimensions"]["personal_rubrics"]["overall"]["wilcoxon"]
    assert set(report["validation"]) >= {"rubric_min_diff", "other_max_diff"}
