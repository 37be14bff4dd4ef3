"""The pair page of a model's result: what the model saw, both answers and both scores at full
precision, linked from the pairs list and the comparison, withheld like every per-pair view."""

import json

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from leaderboard import services
from leaderboard.models import PairScore
from tests.factories import UserFactory
from tests.leaderboard.test_pages import finished_scores
from tests.leaderboard.test_submissions import sample  # noqa: F401 (fixture)

pytestmark = pytest.mark.django_db

CLOSE_CHOSEN, CLOSE_REJECTED = 0.07012345678, 0.0704  # "0.070 vs 0.070" at three decimals


def close_call(user, benchmark, name="Close RM", *, publish=True):
    """Every pair right by a wide margin except the first, wrong by 0.00028."""
    ids = list(benchmark.items.order_by("position").values_list("source_id", flat=True))
    lines = [{"id": ids[0], "chosen_score": CLOSE_CHOSEN, "rejected_score": CLOSE_REJECTED}]
    lines += [{"id": i, "chosen_score": 0.9, "rejected_score": 0.2} for i in ids[1:]]
    upload = SimpleUploadedFile("close.jsonl", "".join(json.dumps(line) + "\n" for line in lines).encode())
    submission = services.submission_create(user=user, request=services.SubmissionRequest(
        display_name=name, benchmark=benchmark.name, kind="scores", settings=("profile",), scores_file=upload))
    services.run_execute(run_id=submission.runs.get().pk)
    if publish:
        services.submission_publish(user=user, submission=submission)
    return submission


def test_the_pair_page_shows_both_scores_at_full_precision_and_what_the_model_saw(client, researcher, sample):
    model = close_call(researcher, sample)
    items = list(sample.items.order_by("position"))
    first, second = items[0], items[1]
    listing = client.get(f"/models/{model.pk}/pairs/", {"setting": "profile"}).content.decode()
    link = f'/models/{model.pk}/pairs/{first.pk}/?setting=profile'
    assert f'href="{link}"' in listing
    # Six significant digits and the margin with its sign: the wrong call reads as wrong.
    assert ">0.0701235<" in listing and ">0.0704<" in listing and ">-0.000277<" in listing

    page = client.get(link)  # anonymous: the model is published
    assert page.status_code == 200
    html = page.content.decode()
    assert '<code id="score-chosen">0.07012345678</code>' in html
    assert '<code id="score-rejected">0.0704</code>' in html
    assert f'<code id="score-margin">{CLOSE_CHOSEN - CLOSE_REJECTED!r}</code>' in html
    assert "wrong: rejected preferred" in html
    for text in (first.question, first.chosen, first.rejected):
        assert text.replace("'", "&#x27;").replace('"', "&quot;") in html
    posts = [post["text"] for post in first.profile][:model.profile_k]
    assert posts and all(f'<p class="post-text">{p}</p>' in html for p in posts[:1])
    assert 'rel="prev"' not in html and f'href="/models/{model.pk}/pairs/{second.pk}/?setting=profile"' in html
    assert client.get(f"/models/{model.pk}/pairs/999999/", {"setting": "profile"}).status_code == 404
    assert client.get(f"/models/{model.pk}/pairs/{first.pk}/", {"setting": "plan"}).status_code == 404


def test_a_judges_pair_page_lists_each_order_with_its_verdict_and_reply(client, researcher, sample):
    model = close_call(researcher, sample)
    item = sample.items.order_by("position").first()
    PairScore.objects.filter(run__submission=model, item=item).update(details={"orders": [
        {"chosen_position": "A", "verdict": "B", "raw": "Reasoning: B is warmer. Verdict: B"},
        {"chosen_position": "B", "verdict": None, "raw": "I cannot decide <b>"}], "parse_failures": 1})
    html = client.get(f"/models/{model.pk}/pairs/{item.pk}/").content.decode()
    assert "Reasoning: B is warmer. Verdict: B" in html and "I cannot decide &lt;b&gt;" in html
    assert "<td>A</td><td>B</td>" in html and "<td>B</td><td>unparseable</td>" in html
    assert "&quot;parse_failures&quot;: 1" in html  # everything stored, as JSON


def test_the_pair_page_is_per_pair_data_withheld_as_the_exports_are(client, researcher, sample, staff_user):
    from annotation.services.campaigns import campaign_create

    private = close_call(researcher, sample, "Private RM", publish=False)
    item = sample.items.order_by("position").first()
    url = f"/models/{private.pk}/pairs/{item.pk}/"
    assert client.get(url).status_code == 404  # not published: not for the public ...
    client.force_login(researcher)
    assert client.get(url).status_code == 200  # ... but for its owner, as its exports
    published = close_call(UserFactory(roles=["researcher"]), sample, "Public RM")
    campaign_create(user=staff_user, benchmark=sample.name, guidelines="g", overlap=1)
    client.force_login(UserFactory(roles=["annotator"]))
    withheld = client.get(f"/models/{published.pk}/pairs/{item.pk}/")
    assert withheld.status_code == 403 and "0.0704" not in withheld.content.decode()


def test_the_comparison_links_each_differing_pair_and_shows_both_models_scores(client, researcher, sample):
    ids = list(sample.items.order_by("position").values_list("source_id", flat=True))
    a = close_call(researcher, sample, "Alpha RM")
    b = finished_scores(researcher, sample, "Beta RM", ids[1:3])
    items = {i.source_id: i.pk for i in sample.items.all()}
    html = client.get(f"/models/{a.pk}/compare/", {"with": b.pk, "setting": "profile"}).content.decode()
    for source_id in ids[:3]:
        assert f'href="/models/{a.pk}/pairs/{items[source_id]}/?setting=profile"' in html
        assert f'href="/models/{b.pk}/pairs/{items[source_id]}/?setting=profile"' in html
    assert "0.0701235, 0.0704" in html and "0.9, 0.2" in html and "0.2, 0.9" in html
