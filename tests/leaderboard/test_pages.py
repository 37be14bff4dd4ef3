"""Researchers finding their way: the submissions queue, navigation by role, error pages."""

import json
import re

import pytest

from leaderboard import services
from leaderboard.models import RunStatus
from tests.factories import UserFactory
from tests.leaderboard.test_submissions import sample, submit_scores  # noqa: F401 (fixture)

pytestmark = pytest.mark.django_db


def nav_links(response) -> set[str]:
    html = response.content.decode()
    nav = html[html.index('<nav class="site-nav"'):html.index("</nav>")]
    import re

    return set(re.findall(r'<a href="([^"]+)"', nav))


def test_the_queue_lists_every_status_with_its_reason_and_only_ones_own(client, researcher, sample):
    failed = submit_scores(researcher, sample, settings=("profile",))
    failed.runs.update(status=RunStatus.FAILED, error="pair 'a1': setting 'plan' needs planner aspects")
    queued = submit_scores(researcher, sample, settings=("no_profile",), wrong={"x"})
    other = UserFactory(roles=["researcher"])
    submit_scores(other, sample, settings=("profile",), wrong={"y"})
    client.force_login(researcher)
    response = client.get("/submissions/")
    assert response.status_code == 200
    listed = {s.pk: s.overall_status for s in response.context["submissions"]}
    assert listed == {failed.pk: "FAILED", queued.pk: "QUEUED"}
    html = response.content.decode()
    assert "planner" in html  # the failure reason is on the page
    assert f'action="/submissions/{queued.pk}/cancel/"' in html and f'action="/submissions/{failed.pk}/retry/"' in html
    assert 'data-confirm="Cancel the unfinished runs' in html
    only_failed = client.get("/submissions/?status=FAILED").context["submissions"]
    assert [s.pk for s in only_failed] == [failed.pk]


def test_the_queue_status_filter_offers_human_labels_and_keeps_the_query_values(client, researcher, sample):
    client.force_login(researcher)
    html = client.get("/submissions/").content.decode()
    options = re.findall(r'<option value="([A-Z]*)"[^>]*>([^<]*)</option>',
                         html.split('id="f-status"')[1].split("</select>")[0])
    assert options == [("", "Every status"), ("RUNNING", "Running"), ("QUEUED", "Queued"), ("PENDING", "Pending"),
                       ("FAILED", "Failed"), ("CANCELLED", "Cancelled"), ("SUCCEEDED", "Succeeded")]
    empty = client.get("/submissions/?status=CANCELLED").content.decode()
    assert '<option value="CANCELLED" selected>Cancelled</option>' in empty
    assert "No submissions with status cancelled yet." in empty


def test_staff_see_everyones_submissions_with_the_owner(client, researcher, staff_user, sample):
    submit_scores(researcher, sample)
    client.force_login(staff_user)
    response = client.get("/submissions/")
    assert len(response.context["submissions"]) == 1 and response.context["show_owner"]
    assert researcher.username in response.content.decode()


def test_an_empty_queue_says_what_to_do_next(client, researcher):
    client.force_login(researcher)
    html = client.get("/submissions/").content.decode()
    assert "No submissions" in html and "manage.py evaluate_rm" in html and 'href="/submit/"' in html


@pytest.mark.parametrize("role, shown, hidden", [
    (None, {"/", "/correlations/"}, {"/submit/", "/annotate/", "/submissions/", "/benchmarks/", "/admin/"}),
    ("annotator", {"/annotate/"}, {"/submit/", "/submissions/", "/benchmarks/", "/admin/", "/pipeline/builds/"}),
    ("researcher", {"/submit/", "/submissions/", "/benchmarks/"}, {"/annotate/", "/admin/", "/pipeline/builds/"}),
    ("staff", {"/submit/", "/submissions/", "/annotate/", "/admin/", "/pipeline/builds/"}, set()),
])
def test_navigation_shows_only_what_the_role_may_open(client, role, shown, hidden):
    if role:
        user = UserFactory(is_staff=True) if role == "staff" else UserFactory(roles=[role])
        client.force_login(user)
    links = nav_links(client.get("/"))
    assert shown <= links and not hidden & links
    for url in links - {"/api/docs/"}:
        assert client.get(url).status_code == 200, url


@pytest.mark.parametrize("url", ["/admin/", "/admin/pipeline/benchmark/", "/admin/login/", "/pipeline/builds/",
                                 "/annotation/campaigns/new/"])
def test_signed_in_non_staff_get_the_apps_403_page_never_the_admin_login(client, researcher, url):
    client.force_login(researcher)
    response = client.get(url)
    assert response.status_code == 403
    assert b"You don't have access to this page" in response.content


def test_anonymous_users_of_staff_pages_go_to_the_apps_login(client):
    response = client.get("/pipeline/builds/")
    assert response.status_code == 302 and response["Location"].startswith("/accounts/login/")


def test_unknown_urls_get_the_apps_404_page_even_with_debug_on(client, settings):
    settings.DEBUG = True
    response = client.get("/no/such/page/")
    assert response.status_code == 404
    html = response.content.decode()
    assert "Page not found" in html and "/no/such/page/" in html
    assert "URLconf" not in html and "admin/" not in html.split("<main")[1]
    api = client.get("/api/submissions/999999/")
    assert api.status_code in (401, 403, 404) and "Page not found" not in api.content.decode()


def finished_scores(user, benchmark, name, wrong=(), *, publish=True):
    from tests.leaderboard.test_submissions import scores_upload

    submission = services.submission_create(user=user, request=services.SubmissionRequest(
        display_name=name, benchmark=benchmark.name, kind="scores", settings=("profile",),
        scores_file=scores_upload(benchmark, wrong=set(wrong), name=f"{len(name)}-{name[:3]}.jsonl")))
    services.run_execute(run_id=submission.runs.get().pk)
    if publish:
        services.submission_publish(user=user, submission=submission)
    return submission


def test_the_leaderboard_searches_by_name_and_downloads_what_it_shows(client, researcher, sample):
    ids = list(sample.items.order_by("position").values_list("source_id", flat=True))
    finished_scores(researcher, sample, "Alpha RM", ids[:3])
    finished_scores(researcher, sample, "=HYPERLINK(\"x\") beta", ids[:9])
    page = client.get("/", {"q": "alpha"})
    assert [r["display_name"] for r in page.context["rows"]] == ["Alpha RM"]
    assert 'href="/leaderboard.csv?q=alpha"' in page.content.decode()
    data = client.get("/leaderboard.json", {"q": "ALPHA"}).json()
    assert [(r["display_name"], r["accuracy"], r["rank"]) for r in data] == [("Alpha RM", 0.9, 1)]
    assert set(data[0]["by_domain"]) == {"arts_entertainment", "lifestyle_personal_development", "society_culture"}
    csv_text = client.get("/leaderboard.csv").content.decode()
    import csv
    import io

    header, first, second = list(csv.reader(io.StringIO(csv_text)))
    assert header[:6] == ["rank", "display_name", "kind", "setting", "benchmark", "accuracy"]
    assert "acc_society_culture" in header
    assert first[1:3] == ["Alpha RM", "scores"]
    assert second[1] == "'=HYPERLINK(\"x\") beta"  # defused: no spreadsheet formula
    api = client.get("/api/leaderboard/", {"q": "beta"}).json()
    assert [r["display_name"] for r in api] == ['=HYPERLINK("x") beta'] and api[0]["accuracy"] == pytest.approx(0.7)


def test_leaderboard_columns_can_be_toggled(client, researcher, sample):
    finished_scores(researcher, sample, "Alpha RM")
    html = client.get("/").content.decode()
    for key in ("kind", "setting", "ci", "domains", "params", "date"):
        assert f'<input type="checkbox" value="{key}" checked>' in html and f'data-col="{key}"' in html


def test_a_finished_model_has_a_public_page_with_card_results_and_predictions(client, researcher, sample):
    ids = list(sample.items.order_by("position").values_list("source_id", flat=True))
    model = finished_scores(researcher, sample, "Alpha RM", ids[:6])
    type(model).objects.filter(pk=model.pk).update(license="apache-2.0", link="https://example.org/alpha",
                                                   parameters=1234567)
    assert f'href="/models/{model.pk}/"' in client.get("/").content.decode()  # leaderboard links the public page
    page = client.get(f"/models/{model.pk}/")  # anonymous
    assert page.status_code == 200
    html = page.content.decode()
    for text in ("apache-2.0", "https://example.org/alpha", "1,234,567", researcher.username, "Uploaded scores",
                 "80.0", "Arts &amp; Entertainment"):
        assert text in html, text
    pairs = client.get(f"/models/{model.pk}/pairs/", {"outcome": "wrong"})
    assert pairs.status_code == 200 and pairs.context["page"].paginator.count == 6
    assert [p.item.source_id for p in pairs.context["page"]] == ids[:6]
    lines = client.get(f"/models/{model.pk}/predictions.jsonl", {"setting": "profile"}).getvalue().decode().splitlines()
    first = json.loads(lines[0])
    assert len(lines) == 30 and first == {
        "id": ids[0], "domain": first["domain"], "chosen_score": 0.2, "rejected_score": 0.9,
        "correct": False, "tie": False, "manifest": model.runs.get().metrics["manifest"]}


def test_model_pages_of_unpublished_unfinished_or_unknown_models_are_404(client, researcher, sample):
    queued = submit_scores(researcher, sample)
    assert client.get(f"/models/{queued.pk}/").status_code == 404
    private = finished_scores(researcher, sample, "Private RM", ["x"], publish=False)
    client.force_login(researcher)  # not even for its owner: the model page is the public view
    assert client.get(f"/models/{private.pk}/").status_code == 404
    assert client.get(f"/models/{private.pk}/predictions.csv").status_code == 404
    assert client.get("/models/999999/").status_code == 404


def test_two_models_compare_on_the_same_pairs_with_agreement_and_mcnemar(client, researcher, sample):
    ids = list(sample.items.order_by("position").values_list("source_id", flat=True))
    a = finished_scores(researcher, sample, "Alpha RM", ids[:2])      # wrong on pairs 0-1
    b = finished_scores(researcher, sample, "Beta RM", ids[:12])      # wrong on pairs 0-11
    response = client.get(f"/models/{a.pk}/compare/", {"with": b.pk, "setting": "profile"})
    assert response.status_code == 200
    result = response.context["result"]
    assert result["n"] == 30
    assert result["agreement"] == pytest.approx(20 / 30)
    assert (result["accuracy_a"], result["accuracy_b"]) == (pytest.approx(28 / 30), pytest.approx(18 / 30))
    assert (result["mcnemar"]["a_only"], result["mcnemar"]["b_only"]) == (10, 0)
    assert result["mcnemar"]["p_value"] == pytest.approx(2 * 0.5 ** 10)  # exact binomial, two-sided
    assert [(row["id"], row["a"], row["b"]) for row in result["differ"]] == [
        (i, "chosen", "rejected") for i in ids[2:12]]
    assert client.get(f"/models/{a.pk}/compare/", {"with": "x"}).status_code == 404


@pytest.mark.parametrize("debug", [False, True])  # the demo runs with DEBUG on: its 404 page must not hide this one
def test_comparing_in_a_setting_the_other_model_lacks_says_why_and_links_the_shared_ones(
        client, researcher, sample, settings, debug):
    settings.DEBUG = debug
    # The model page offers this model's settings; the other model may lack the chosen one
    # (the demo: a scalar RM run without and with profile against baselines run with profile only).
    ids = list(sample.items.order_by("position").values_list("source_id", flat=True))
    a = finished_scores(researcher, sample, "Alpha RM", ids[:1])
    b = finished_scores(researcher, sample, "Beta RM", ids[:2])
    extra = a.runs.get()
    extra.pk, extra.setting = None, "no_profile"
    extra.save()
    response = client.get(f"/models/{a.pk}/compare/", {"with": b.pk, "setting": "no_profile"})
    assert response.status_code == 404
    text = response.content.decode()
    assert "<strong>Beta RM</strong> has no finished result without profile" in text
    assert f'href="/models/{a.pk}/compare/?with={b.pk}&amp;setting=profile">With profile</a>' in text
    b.runs.update(setting="plan")  # no setting in common
    text = client.get(f"/models/{a.pk}/compare/", {"with": b.pk, "setting": "profile"}).content.decode()
    assert "has no finished result with profile" in text and "They share no setting." in text


def test_the_compare_form_offers_only_settings_another_model_shares(client, researcher, sample):
    ids = list(sample.items.order_by("position").values_list("source_id", flat=True))
    a = finished_scores(researcher, sample, "Alpha RM", ids[:1])
    b = finished_scores(researcher, sample, "Beta RM", ids[:2])
    c = finished_scores(researcher, sample, "Gamma RM", ids[:3])
    for model, setting in ((a, "no_profile"), (a, "plan"), (c, "no_profile")):
        extra = model.runs.get(setting="profile")
        extra.pk, extra.setting = None, setting
        extra.save()
    d = finished_scores(researcher, sample, "Delta RM", ids[:4])
    d.runs.update(setting="plan")  # only Alpha has plan too
    html = client.get(f"/models/{b.pk}/").content.decode()
    form = html.split('id="compare-setting"')[1].split("</select>")[0]
    # Beta has profile only: Alpha and Gamma share it, Delta (plan only) shares nothing with Beta.
    assert re.findall(r'<option value="(\w+)" data-with="([\d ]*)">([^<]*)</option>', form) == [
        ("profile", f"{a.pk} {c.pk}", "With profile")]
    assert "Delta RM" not in html.split('id="compare-with"')[1].split("</select>")[0]
    html = client.get(f"/models/{a.pk}/").content.decode()
    form = html.split('id="compare-setting"')[1].split("</select>")[0]
    assert re.findall(r'<option value="(\w+)" data-with="([\d ]*)">([^<]*)</option>', form) == [
        ("no_profile", f"{c.pk}", "Without profile (only Gamma RM)"),
        ("plan", f"{d.pk}", "With plan (only Delta RM)"),
        ("profile", f"{b.pk} {c.pk}", "With profile (only Beta RM, Gamma RM)")]
    assert "js/model.js" in html


def test_the_submit_form_marks_each_field_with_the_kinds_that_use_it(client, researcher, sample):
    client.force_login(researcher)
    response = client.get("/submit/")
    html = response.content.decode()
    assert 'id="field-scores_file" data-kinds="scores"' in html
    assert 'id="field-m" data-kinds="pgenrm"' in html
    assert 'id="field-judge_backend" data-kinds="pairwise pointwise pgenrm"' in html
    assert 'id="field-display_name" data-kinds' not in html
    assert response.context["benchmark_settings"] == {"sample": ("no_profile", "profile")}


def test_the_example_scores_file_lists_every_pair_once_and_scores_zero(client, researcher, sample):
    from tests.leaderboard.test_submissions import SimpleUploadedFile

    client.force_login(researcher)
    response = client.get("/submit/example-scores.jsonl", {"benchmark": "sample"})
    assert response["Content-Disposition"] == 'attachment; filename="sample-scores-example.jsonl"'
    rows = [json.loads(line) for line in response.content.decode().splitlines()]
    assert [r["id"] for r in rows] == list(sample.items.order_by("position").values_list("source_id", flat=True))
    assert {(r["chosen_score"], r["rejected_score"]) for r in rows} == {(0.0, 0.0)}
    # Uploaded unchanged it is accepted, and scores 0% (all ties).
    upload = SimpleUploadedFile("example.jsonl", response.content)
    submission = services.submission_create(user=researcher, request=services.SubmissionRequest(
        display_name="example", benchmark="sample", kind="scores", settings=("profile",), scores_file=upload))
    services.run_execute(run_id=submission.runs.get().pk)
    metrics = submission.runs.get().metrics
    assert (metrics["accuracy"], metrics["tie_rate"]) == (0.0, 1.0)
    assert client.get("/submit/example-scores.jsonl", {"benchmark": "nope"}).status_code == 404


def test_the_submit_form_ignores_fields_of_other_kinds_and_shows_every_error(client, researcher, sample):
    client.force_login(researcher)
    response = client.post("/submit/", {
        "display_name": "x", "benchmark": "sample", "kind": "scalar", "settings": ["profile", "plan"],
        "model_path": "missing-folder", "dtype": "auto", "max_length": 4096, "batch_size": 8, "profile_k": 10,
        "m": 4, "n": 0, "prototypes": "ignored-for-scalar"})
    assert response.status_code == 200
    errors = response.context["form"].errors
    assert set(errors) == {"settings", "model_path"}
    assert "does not support the plan setting" in errors["settings"][0]
    assert "does not exist" in errors["model_path"][0]


def test_a_valid_submission_through_the_form_is_queued_and_shown(client, researcher, sample):
    from tests.leaderboard.test_submissions import scores_upload

    client.force_login(researcher)  # request.user is a lazy object here, unlike in service tests
    response = client.post("/submit/", {
        "display_name": "Form RM", "benchmark": "sample", "kind": "scores", "settings": ["profile"],
        "scores_file": scores_upload(sample)})
    submission = researcher.submissions.get()
    assert response.status_code == 302 and response["Location"] == f"/submissions/{submission.pk}/"
    assert submission.display_name == "Form RM" and submission.runs.get().status == RunStatus.QUEUED


def test_the_submission_page_offers_cancel_and_retry_only_when_they_would_act(client, researcher, sample):
    ids = list(sample.items.order_by("position").values_list("source_id", flat=True))
    queued = submit_scores(researcher, sample, settings=("profile",))
    failed = finished_scores(researcher, sample, "Failed RM", ids[:1], publish=False)
    failed.runs.update(status=RunStatus.FAILED, error="out of memory")
    done = finished_scores(researcher, sample, "Done RM", ids[:2], publish=False)
    client.force_login(researcher)
    buttons = {}
    for name, submission in (("queued", queued), ("failed", failed), ("done", done)):
        html = client.get(f"/submissions/{submission.pk}/").content.decode()
        buttons[name] = ('id="cancel-button"' in html, 'id="retry-button"' in html, 'id="publish-button"' in html)
    # A submission whose every run failed has nothing to publish (newcomer walk: Publish stood beside Retry).
    assert buttons == {"queued": (True, False, True), "failed": (False, True, False), "done": (False, False, True)}


def test_the_submission_page_explains_the_hash_formats_numbers_wraps_the_manifest_and_charts_own_domains(
        client, researcher, sample):
    ids = list(sample.items.order_by("position").values_list("source_id", flat=True))
    done = finished_scores(researcher, sample, "Done RM", ids[:2], publish=False)
    type(done).objects.filter(pk=done.pk).update(parameters=1011393, weights_hash="")
    client.force_login(researcher)
    response = client.get(f"/submissions/{done.pk}/")
    html = response.content.decode()
    assert "<dd>1,011,393</dd>" in html
    assert '<span class="muted" id="weights-hash-pending">computed by the worker when the first run starts</span>' in html
    manifest = html.split('<summary>What reproduces the with profile result</summary>')[1].split("</details>")[0]
    assert "{'" not in manifest and '<dl class="facts manifest-facts">' in manifest  # no Python dict repr
    assert "<dt><code>code_version</code></dt>" in manifest and '<pre class="prose-text">{\n &quot;' in manifest
    # The sample benchmark has LaMP-QA items only: no empty PRISM or Chatbot Arena bars.
    assert sorted(response.context["domain_labels"]) == sorted(
        set(sample.items.values_list("domain", flat=True))) == ["arts_entertainment", "lifestyle_personal_development", "society_culture"]
    type(done).objects.filter(pk=done.pk).update(weights_hash="ab" * 32)
    html = client.get(f"/submissions/{done.pk}/").content.decode()
    assert f'<code class="hash" title="{"ab" * 32}">{"ab" * 8}</code>' in html and "weights-hash-pending" not in html
