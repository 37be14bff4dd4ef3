"""Annotators stay blind (issue 33, fault 2).

(a) Per-pair data of a benchmark (a published model's per-pair scores, the benchmark browser's
answer key, a comparison's differing pairs) is withheld from anyone who may rate its pairs, and
from anonymous visitors, while a campaign on it is open (pipeline/blindness.py).
(b) The display order is an HMAC under the server's secret: the ids alone do not give it.

The last test is the attack itself: an annotator who is also a researcher, owns a published
length baseline on the benchmark (its scores are the answers' word counts) and reads every page
and API the URLconf has, then guesses which of the two answers on their rating screen is chosen.
"""

import html
import json
import random
import re
import hashlib

import pytest
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver
from rest_framework.authtoken.models import Token

from annotation.models import Assignment
from annotation.services.campaigns import campaign_create, campaign_set_open
from annotation.services.leases import chosen_first
from leaderboard import services
from leaderboard.models import Submission
from pipeline.models import BenchmarkItem
from pipeline.services import benchmark_import
from tests.factories import UserFactory
from tests.pipeline.test_formats import SAMPLE
from django.core.files.uploadedfile import SimpleUploadedFile

pytestmark = pytest.mark.django_db

# --- (b) the display order ------------------------------------------------------------------


def _bare_recipe(campaign_id, annotator_id, item_id) -> bool:
    """The former order: sha256 of the ids and a fixed text, which anyone could recompute."""
    digest = hashlib.sha256(f"prbench-order:{campaign_id}:{annotator_id}:{item_id}".encode()).digest()
    return digest[0] % 2 == 0


def test_the_display_order_is_an_hmac_under_the_server_secret(settings):
    grid = [(7, a, i) for a in range(20) for i in range(20)]  # 400 (campaign, annotator, pair)

    def orders(secret):
        settings.SECRET_KEY = secret
        return [chosen_first(campaign_id=c, annotator_id=a, item_id=i) for c, a, i in grid]

    first, second = orders("k" * 50), orders("q" * 50)
    assert first == orders("k" * 50)  # stable under one secret (a reload shows the same order)
    # Under another secret about half the orders change, and the ids' bare hash predicts about
    # half: within 167..233 of 400, the 99.9% range of a fair coin (binomial n=400, p=0.5).
    assert 167 <= sum(x != y for x, y in zip(first, second)) <= 233
    assert 167 <= sum(x == _bare_recipe(*ids) for x, ids in zip(first, grid)) <= 233
    assert 167 <= sum(first) <= 233  # Response 1 is the chosen one about half the time


# --- (a) per-pair data withheld --------------------------------------------------------------


def _scores(benchmark, score) -> SimpleUploadedFile:
    """Uploaded scores: score(answer text) for each pair's chosen and rejected answer."""
    lines = [json.dumps({"id": i.source_id, "chosen_score": score(i.chosen), "rejected_score": score(i.rejected)})
             for i in benchmark.items.order_by("position")]
    return SimpleUploadedFile("length.jsonl", ("\n".join(lines) + "\n").encode(), content_type="application/jsonl")


@pytest.fixture
def world(db):
    """A benchmark with a published length baseline owned by a researcher who is also an
    annotator, another published model, and an open campaign on the benchmark."""
    bench = benchmark_import(path=SAMPLE, name="sample").benchmark
    staff = UserFactory(is_staff=True, is_superuser=True)
    attacker = UserFactory(roles=["researcher", "annotator"], username="mallory")
    other = UserFactory(roles=["researcher"], username="olivia")
    submissions = []
    rng = random.Random(5)
    for owner, name, score in ((attacker, "length baseline", lambda text: len(text.split())),
                               (other, "another model", lambda text: round(rng.random(), 3))):
        submission = services.submission_create(user=owner, request=services.SubmissionRequest(
            display_name=name, benchmark="sample", kind="scores", settings=("no_profile",),
            scores_file=_scores(bench, score), options={}))
        services.run_execute(run_id=submission.runs.get().pk)
        services.submission_publish(user=owner, submission=submission)
        submissions.append(submission)
    campaign = campaign_create(user=staff, benchmark="sample", guidelines="g", overlap=2)
    return {"bench": bench, "staff": staff, "attacker": attacker, "other": other, "campaign": campaign,
            "submissions": submissions}


def _client(user) -> Client:
    client = Client()
    if user is not None:
        client.force_login(user)
    return client


def _body(response) -> str:
    raw = b"".join(response.streaming_content) if response.streaming else response.content
    return html.unescape(raw.decode(errors="replace"))


def _per_pair_urls(world) -> dict[str, str]:
    length, another = world["submissions"]
    run = length.runs.get()
    item = world["bench"].items.order_by("position").first()
    return {
        "model pairs": f"/models/{length.pk}/pairs/",
        "model predictions csv": f"/models/{length.pk}/predictions.csv",
        "model predictions jsonl": f"/models/{length.pk}/predictions.jsonl",
        "model compare": f"/models/{length.pk}/compare/?with={another.pk}",
        "run export": f"/submissions/{length.pk}/runs/{run.pk}/scores.csv",
        "api scores": f"/api/submissions/{length.pk}/scores/?run={run.pk}",
        "item page": f"/benchmarks/sample/items/{item.pk}/",
        "api items": "/api/benchmarks/sample/items/",
    }


WITHHELD = "Per-pair results of benchmark 'sample' are withheld while a blind rating campaign on it is open"


def test_per_pair_data_is_withheld_from_whoever_may_rate_while_a_campaign_is_open(world):
    urls = _per_pair_urls(world)
    rater = UserFactory(roles=["researcher"], username="rita")  # no annotator role, but holds an assignment
    Assignment.objects.create(token="t" * 32, campaign=world["campaign"], pair=world["campaign"].pairs.first(),
                              annotator=rater, chosen_first=True, expires_at="2030-01-01T00:00:00Z")
    users = {"attacker (researcher + annotator)": world["attacker"], "rater (researcher, assigned)": rater,
             "anonymous": None, "other researcher": world["other"], "staff": world["staff"]}

    def seen(user):
        out = {}
        for view, url in urls.items():
            response = _client(user).get(url)
            out[view] = (response.status_code, WITHHELD in _body(response))
        return out

    withheld = {view: (403, True) for view in urls}
    # Anonymous visitors are sent to log in for the researcher-only browser (302), and get the
    # reason everywhere else.
    anonymous = {**withheld, "item page": (302, False), "api items": (401, False)}
    assert {who: seen(user) for who, user in users.items()} == {
        "attacker (researcher + annotator)": withheld, "rater (researcher, assigned)": withheld,
        "anonymous": anonymous,
        "other researcher": {view: (200, False) for view in urls},
        "staff": {view: (200, False) for view in urls},
    }
    # The API's refusal is JSON with the reason.
    response = _client(world["attacker"]).get(urls["api scores"])
    assert response["Content-Type"].startswith("application/json")
    assert response.json()["detail"].startswith(WITHHELD)
    # The model page still shows the results, says why the predictions are not offered, and
    # offers no link to them.
    page = _client(None).get(f"/models/{world['submissions'][0].pk}/").content.decode()
    assert "Withheld during blind rating" in page and "predictions.csv" not in page

    campaign_set_open(campaign=world["campaign"], is_open=False)
    assert seen(None) == {**{view: (200, False) for view in urls}, "item page": (302, False),
                          "api items": (401, False)}
    assert seen(world["attacker"]) == {view: (200, False) for view in urls}


# --- the attack ----------------------------------------------------------------------------


def _routes(resolver=None, prefix=""):
    """Every URL pattern of the site as text (path() routes and re_path() regexes)."""
    resolver = resolver or get_resolver()
    for entry in resolver.url_patterns:
        if isinstance(entry, URLResolver):
            yield from _routes(entry, prefix + str(entry.pattern))
        elif isinstance(entry, URLPattern):
            yield prefix + str(entry.pattern)


def _fill(route: str, values: dict[str, list[str]]) -> list[str]:
    """Concrete URLs for a route: every combination of the candidate values of its parameters
    (`<conv:name>` or `(?P<name>...)`); routes with a parameter without candidates are left out."""
    route = route.replace("^", "").replace("$", "").replace("\\.", ".")
    names = re.findall(r"<(?:\w+:)?(\w+)>|\(\?P<(\w+)>[^)]*\)", route)
    urls = ["/" + route]
    for converter_name, group_name in names:
        name = converter_name or group_name
        if name not in values:
            return []
        pattern = re.compile(rf"<(?:\w+:)?{name}>|\(\?P<{name}>[^)]*\)")
        urls = [pattern.sub(value, url, count=1) for url in urls for value in values[name]]
    return urls


def _crawl(world, user) -> list[str]:
    """The bodies of every GET the URLconf answers for `user`, with the ids that exist filled in
    and the query strings the per-pair views take. Writes and admin pages are left out (the
    admin is staff-only; writes change nothing an attacker could read that GETs do not show)."""
    subs = Submission.objects.filter(benchmark=world["bench"])
    runs = [str(r.pk) for s in subs for r in s.runs.all()]
    items = [str(pk) for pk in BenchmarkItem.objects.filter(benchmark=world["bench"]).values_list("pk", flat=True)]
    tokens = list(Assignment.objects.filter(annotator=world["attacker"]).values_list("token", flat=True))
    submission_ids, campaign_ids = [str(s.pk) for s in subs], [str(world["campaign"].pk)]
    values = {"name": ["sample"], "benchmark_name": ["sample"], "run_id": runs,
              "fmt": ["csv", "json", "jsonl"], "token": tokens,
              "pair_id": list(BenchmarkItem.objects.filter(benchmark=world["bench"]).values_list("source_id",
                                                                                                flat=True))}

    def queries(route):  # the query strings each kind of view reads
        return ["", *(["?setting=no_profile"] if "models/" in route else []),
                *([f"?with={s.pk}&setting=no_profile" for s in subs] if "compare" in route else []),
                *([f"?run={r}" for r in runs] + [f"?run={r}&format=csv" for r in runs] if "scores" in route else []),
                *(["?format=csv"] if route.startswith("api/") else []),
                *(["?tables=1"] if route.startswith("api/leaderboard") else [])]
    client = _client(user)
    token = Token.objects.get_or_create(user=user)[0].key if user is not None else None
    bodies = []
    for route in _routes():
        if route.startswith("admin/"):
            continue
        # An id parameter takes the ids of what its route is about (every other is a 404).
        ids = (items if "items/" in route else campaign_ids if "annotat" in route
               else submission_ids if ("models/" in route or "submissions" in route) else [])
        for url in _fill(route, {**values, "pk": ids}):
            for query in queries(route):
                headers = {"HTTP_AUTHORIZATION": f"Token {token}"} if token and url.startswith("/api/") else {}
                response = client.get(url + query, **headers)
                if response.status_code == 200:
                    bodies.append(_body(response))
    return bodies


def _adjacent_numbers(bodies) -> set[tuple[float, float]]:
    """Every two numbers that follow each other in a body (HTML tags and escapes removed): a
    per-pair row shows a chosen score beside a rejected one, in a table, a CSV or JSON line."""
    pairs = set()
    for body in bodies:
        numbers = [float(n) for n in re.findall(r"-?\d+(?:\.\d+)?", re.sub(r"<[^>]+>", " ", body))]
        pairs.update(zip(numbers, numbers[1:]))
    return pairs


def _guesses(shown, adjacent, rng) -> list[bool]:
    """For each pair as shown ((text 1, text 2), truth), whether the guess "Response 1 is
    chosen" or "Response 2 is chosen" is right: from a row (words of 1, words of 2) in that
    order or reversed when one is found, else a coin flip."""
    right = []
    for (one, two), one_is_chosen in shown:
        w1, w2 = float(len(one.split())), float(len(two.split()))
        if w1 != w2 and ((w1, w2) in adjacent) != ((w2, w1) in adjacent):
            guess = (w1, w2) in adjacent
        else:
            guess = rng.random() < 0.5
        right.append(guess == one_is_chosen)
    return right


def _rate_every_pair(world) -> list[tuple[tuple[str, str], bool]]:
    """The attacker takes every pair of the campaign on the rating screen's API, rating each."""
    client = _client(world["attacker"])
    shown = []
    while True:
        response = client.get(f"/api/annotation/next/?campaign={world['campaign'].pk}")
        if response.status_code == 204:
            return shown
        payload = response.json()
        texts = tuple(r["text"] for r in payload["responses"])
        truth = Assignment.objects.get(token=payload["assignment"]).chosen_first  # for scoring only
        shown.append((texts, truth))
        ratings = {key: {d["key"]: 3 for d in payload["dimensions"]} for key in ("1", "2")}
        stored = client.post("/api/annotation/ratings/", {"assignment": payload["assignment"], "ratings": ratings},
                             content_type="application/json")
        assert stored.status_code == 201, stored.content


def test_an_annotator_with_every_page_and_api_cannot_beat_chance(world):
    shown = _rate_every_pair(world)
    assert len(shown) == 30
    readable = [(texts, truth) for texts, truth in shown if len(texts[0].split()) != len(texts[1].split())]
    assert len(readable) >= 25  # the pairs a word count could tell apart at all

    bodies = _crawl(world, world["attacker"]) + _crawl(world, None)
    assert len(bodies) >= 20  # the leaderboard, the model pages, the rating screens... were read
    right = _guesses(readable, _adjacent_numbers(bodies), random.Random(33))
    # No better than a fair coin: at most the 99.9% quantile of Binomial(n, 0.5) (n = 30: 23).
    from scipy.stats import binom

    assert sum(right) <= binom.ppf(0.999, len(readable), 0.5)

    # The same attack once the campaign closes (per-pair data public again) names every pair:
    # the check above could fail.
    campaign_set_open(campaign=world["campaign"], is_open=False)
    right = _guesses(readable, _adjacent_numbers(_crawl(world, None)), random.Random(33))
    assert sum(right) == len(readable)
