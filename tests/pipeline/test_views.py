import re

import factory
import pytest
from django.contrib.auth import views as auth_views
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import NoReverseMatch, include, path, reverse
from django.utils import timezone

from pipeline.models import Domain
from leaderboard import views as leaderboard_views
from tests.factories import BenchmarkFactory, BenchmarkItemFactory

pytestmark = pytest.mark.django_db

# A URL configuration with only the pages that exist before the other apps add theirs
# (no leaderboard, annotation, API docs or admin), used as ROOT_URLCONF by the nav test.
urlpatterns = [
    path("", leaderboard_views.leaderboard, name="home"),
    path("accounts/login/", auth_views.LoginView.as_view(), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("", include("pipeline.urls")),
]


def page_urls(benchmark, item):
    return [
        reverse("pipeline:benchmark-list"),
        reverse("pipeline:benchmark-detail", args=[benchmark.name]),
        reverse("pipeline:item-detail", args=[benchmark.name, item.pk]),
    ]


@pytest.fixture
def item():
    return BenchmarkItemFactory()


def item_rows(response) -> list[str]:
    """Source ids of the rows in the item table, in order."""
    return re.findall(r'<code class="source-id">([^<]+)</code>', response.content.decode())


def test_anonymous_visitors_are_redirected_to_login_on_every_browser_page(client, item):
    for url in page_urls(item.benchmark, item):
        response = client.get(url)
        assert response.status_code == 302
        assert response.url.startswith(reverse("login") + "?next=")


def test_annotators_are_forbidden_from_every_browser_page_because_it_shows_the_answer_key(client, annotator, item):
    client.force_login(annotator)
    for url in page_urls(item.benchmark, item):
        assert client.get(url).status_code == 403


@pytest.mark.parametrize("user_fixture", ["researcher", "staff_user"])
def test_researchers_and_staff_can_open_every_browser_page(client, request, user_fixture, item):
    client.force_login(request.getfixturevalue(user_fixture))
    for url in page_urls(item.benchmark, item):
        assert client.get(url).status_code == 200


def test_benchmark_list_shows_each_benchmark_with_counts_hash_and_badges(client, researcher):
    real = BenchmarkFactory(name="lamp-real", metadata={}, content_hash="ab" * 32, frozen_at=timezone.now())
    synthetic = BenchmarkFactory(name="tiny-synthetic", item_count=3)
    BenchmarkItemFactory.create_batch(2, benchmark=synthetic, domain=Domain.ARTS)
    BenchmarkItemFactory(benchmark=synthetic, domain=Domain.SOCIETY)
    client.force_login(researcher)

    html = client.get(reverse("pipeline:benchmark-list")).content.decode()

    assert f'href="{real.get_absolute_url()}"' in html
    assert f'href="{synthetic.get_absolute_url()}"' in html
    assert "abababababab" in html  # short hash
    assert "Society &amp; Culture" in html
    row = html[html.index("tiny-synthetic"):]
    row = row[:row.index("</tr>")]
    assert 'data-label="Arts &amp; Entertainment">2<' in row
    assert 'data-label="Society &amp; Culture">1<' in row
    assert 'data-label="Lifestyle &amp; Personal Development">0<' in row
    assert "badge-synthetic" in row
    real_row = html[html.index("lamp-real"):]
    real_row = real_row[:real_row.index("</tr>")]
    assert "badge-frozen" in real_row and "badge-synthetic" not in real_row


def test_benchmark_detail_shows_header_metadata_and_stats(client, researcher):
    benchmark = BenchmarkFactory(
        name="with-stats", description="Three users, three questions.",
        metadata={"synthetic": True, "license": "CC-BY-4.0"},
        stats={"overall": {"items": 4, "mean_chosen_words": 120.5, "mean_rejected_words": 110.0,
                           "mean_length_ratio": 1.096, "mean_profile_posts": 10.0, "mean_rubric_aspects": 3.0},
               "by_domain": {Domain.LIFESTYLE: {"items": 4, "mean_chosen_words": 120.5, "mean_rejected_words": 110.0,
                                                "mean_length_ratio": 1.096, "mean_profile_posts": 10.0,
                                                "mean_rubric_aspects": 3.0}}},
    )
    client.force_login(researcher)

    html = client.get(benchmark.get_absolute_url()).content.decode()

    assert "Three users, three questions." in html
    assert benchmark.content_hash in html
    assert "CC-BY-4.0" in html
    assert "badge-synthetic" in html
    assert "not frozen" in html
    stats = html[html.index('id="stats-table"'):]
    stats = stats[:stats.index("</table>")]
    assert "Lifestyle &amp; Personal Development" in stats
    assert "120.5" in stats and "110.0" in stats and "1.096" in stats and "10.0" in stats


def test_benchmark_detail_paginates_items_twenty_five_per_page(client, researcher):
    benchmark = BenchmarkFactory()
    BenchmarkItemFactory.create_batch(30, benchmark=benchmark)
    client.force_login(researcher)

    first = client.get(benchmark.get_absolute_url())
    second = client.get(benchmark.get_absolute_url(), {"page": 2})

    assert len(item_rows(first)) == 25
    assert len(item_rows(second)) == 5
    assert set(item_rows(first)).isdisjoint(item_rows(second))
    assert "Page 2 of 2" in second.content.decode()


def test_domain_filter_shows_only_that_domain_and_survives_pagination_links(client, researcher):
    benchmark = BenchmarkFactory()
    BenchmarkItemFactory.create_batch(27, benchmark=benchmark, domain=Domain.SOCIETY,
                                      source_id=factory.Iterator([f"soc-{n}" for n in range(27)]))
    BenchmarkItemFactory.create_batch(4, benchmark=benchmark, domain=Domain.ARTS,
                                      source_id=factory.Iterator([f"art-{n}" for n in range(4)]))
    client.force_login(researcher)

    response = client.get(benchmark.get_absolute_url(), {"domain": Domain.SOCIETY})
    html = response.content.decode()

    assert all(source_id.startswith("soc-") for source_id in item_rows(response))
    assert len(item_rows(response)) == 25
    assert "of 27 matching items" in " ".join(html.split())
    next_link = re.search(r'<a class="page-link" rel="next" href="([^"]+)"', html).group(1)
    assert f"domain={Domain.SOCIETY}" in next_link and "page=2" in next_link

    page_two = client.get(benchmark.get_absolute_url() + next_link.replace("&amp;", "&").split("#")[0])
    assert item_rows(page_two) == ["soc-25", "soc-26"]


def test_search_matches_question_text_or_source_id_and_survives_pagination_links(client, researcher):
    benchmark = BenchmarkFactory()
    BenchmarkItemFactory.create_batch(26, benchmark=benchmark, question=factory.Iterator(
        [f"How do I learn watercolour painting, part {n}?" for n in range(26)]))
    BenchmarkItemFactory(benchmark=benchmark, source_id="watercolour-by-id", question="Unrelated question")
    BenchmarkItemFactory(benchmark=benchmark, source_id="other", question="How do I fix my bike?")
    client.force_login(researcher)

    response = client.get(benchmark.get_absolute_url(), {"q": "WATERCOLOUR"})
    html = response.content.decode()

    assert "other" not in item_rows(response)
    assert "of 27 matching items" in " ".join(html.split())
    next_link = re.search(r'<a class="page-link" rel="next" href="([^"]+)"', html).group(1)
    assert "q=WATERCOLOUR" in next_link and "page=2" in next_link
    page_two = client.get(benchmark.get_absolute_url() + next_link.replace("&amp;", "&").split("#")[0])
    assert len(item_rows(page_two)) == 2 and item_rows(page_two)[-1] == "watercolour-by-id"


def test_an_unknown_domain_in_the_filter_is_reported_not_a_server_error(client, researcher, item):
    client.force_login(researcher)
    response = client.get(item.benchmark.get_absolute_url(), {"domain": "astrology"})
    assert response.status_code == 200
    assert "Select a valid choice" in response.content.decode()


def test_item_page_shows_ranked_profile_posts_with_their_own_ids_and_texts(client, researcher):
    profile = [
        {"id": "post-most-relevant", "text": "I paint landscapes every weekend.", "category": "Art"},
        {"id": "post-second", "text": "My budget for supplies is small.", "category": "Lifestyle"},
        {"id": "post-least", "text": "I once visited a gallery in Lyon.", "category": "Art"},
    ]
    item = BenchmarkItemFactory(profile=profile)
    client.force_login(researcher)

    html = client.get(item.get_absolute_url()).content.decode()

    posts = re.findall(r'<li class="profile-post" data-rank="(\d+)" data-post-id="([^"]*)">(.*?)</li>', html, re.S)
    assert [(rank, post_id) for rank, post_id, _ in posts] == [
        ("1", "post-most-relevant"), ("2", "post-second"), ("3", "post-least")]
    for (_, post_id, body), expected in zip(posts, profile, strict=True):
        assert f'<code class="post-id">{post_id}</code>' in body
        assert expected["text"] in body
        assert expected["category"] in body


def test_item_page_shows_question_rubric_narrative_and_both_answers_labelled(client, researcher):
    item = BenchmarkItemFactory(
        question="Which camera should I buy?",
        rubric_aspects=[{"aspect": "Mentions second-hand gear", "evidence": "buys used lenses",
                         "reason": "saves money"}],
        narrative="Prefers frugal, practical advice.",
        chosen="Buy a used mirrorless body.", rejected="Buy the newest flagship.",
    )
    client.force_login(researcher)

    html = client.get(item.get_absolute_url()).content.decode()

    assert "Which camera should I buy?" in html
    assert "Mentions second-hand gear" in html and "buys used lenses" in html and "saves money" in html
    assert "Prefers frugal, practical advice." in html
    chosen = html[html.index('id="answer-chosen"'):]
    chosen = chosen[:chosen.index("</article>")]
    rejected = html[html.index('id="answer-rejected"'):]
    rejected = rejected[:rejected.index("</article>")]
    assert "Chosen" in chosen and "Buy a used mirrorless body." in chosen
    assert "Rejected" in rejected and "Buy the newest flagship." in rejected


def test_item_page_links_to_the_previous_and_next_items_of_the_same_benchmark(client, researcher):
    benchmark = BenchmarkFactory()
    first, middle, last = BenchmarkItemFactory.create_batch(3, benchmark=benchmark)
    BenchmarkItemFactory()  # another benchmark's item must not be a neighbour
    client.force_login(researcher)

    html = client.get(middle.get_absolute_url()).content.decode()
    assert f'rel="prev" href="{first.get_absolute_url()}"' in html
    assert f'rel="next" href="{last.get_absolute_url()}"' in html
    assert 'rel="prev"' not in client.get(first.get_absolute_url()).content.decode()
    assert 'rel="next"' not in client.get(last.get_absolute_url()).content.decode()


def test_an_item_requested_under_another_benchmark_is_not_found(client, researcher, item):
    other = BenchmarkFactory()
    client.force_login(researcher)
    assert client.get(reverse("pipeline:item-detail", args=[other.name, item.pk])).status_code == 404
    assert client.get(reverse("pipeline:benchmark-detail", args=["no-such-benchmark"])).status_code == 404


def test_nav_shows_existing_pages_and_hides_links_whose_urls_do_not_exist(client, staff_user, settings):
    client.force_login(staff_user)
    html = client.get(reverse("home")).content.decode()
    nav = html[html.index('<nav class="site-nav"'):]
    nav = nav[:nav.index("</nav>")]

    assert f'href="{reverse("home")}"' in nav
    assert f'href="{reverse("pipeline:benchmark-list")}"' in nav
    assert f'href="{reverse("admin:index")}"' in nav
    assert f'href="{reverse("api-docs")}"' not in nav  # in the footer, so the staff bar fits one row
    footer = html[html.index('<footer class="site-footer">'):]
    assert f'<a href="{reverse("api-docs")}">API docs</a>' in footer
    # Whatever a later app has registered is linked; whatever it has not, is absent.
    for name, label in [("leaderboard:submit", "Submit"), ("annotation:annotate", "Annotate"),
                        ("leaderboard:correlations", "Correlations")]:
        try:
            url = reverse(name)
        except NoReverseMatch:
            assert f">{label}<" not in nav
        else:
            assert f'href="{url}"' in nav


def test_nav_hides_links_to_unregistered_pages(client, researcher, settings):
    settings.ROOT_URLCONF = __name__
    client.force_login(researcher)
    html = client.get("/").content.decode()
    nav = html[html.index('<nav class="site-nav"'):]
    nav = nav[:nav.index("</nav>")]
    for label in ("Submit", "Annotate", "Correlations", "Paper table", "API docs", "Admin"):
        assert f">{label}<" not in nav
    assert ">Leaderboard<" in nav and ">Benchmarks<" in nav


def test_admin_link_is_only_for_staff(client, researcher):
    client.force_login(researcher)
    assert f'href="{reverse("admin:index")}"' not in client.get(reverse("home")).content.decode()


def test_home_shows_an_empty_state_with_the_import_command_when_there_are_no_benchmarks(client):
    html = client.get(reverse("home")).content.decode()
    assert "No benchmarks yet" in html
    assert "python manage.py import_benchmark PATH --name NAME" in html


def test_home_lists_benchmarks_with_links_counts_and_badges(client):
    benchmark = BenchmarkFactory(name="demo-v1", item_count=1234, frozen_at=timezone.now())
    html = client.get(reverse("home")).content.decode()
    assert f'href="{benchmark.get_absolute_url()}"' in html
    assert "1,234" in html
    assert "badge-synthetic" in html and "badge-frozen" in html
    assert benchmark.created_at.strftime("%Y-%m-%d") in html
    assert "No benchmarks yet" not in html


def test_logged_in_users_see_their_name_and_log_out_with_a_post_form(client, researcher):
    client.force_login(researcher)
    html = client.get(reverse("home")).content.decode()
    assert researcher.username in html
    form = re.search(r'<form method="post" action="%s"[^>]*>(.*?)</form>' % reverse("logout"), html, re.S)
    assert form is not None
    assert "csrfmiddlewaretoken" in form.group(1)
    client.post(reverse("logout"))
    assert "_auth_user_id" not in client.session


def test_anonymous_visitors_get_a_log_in_link(client):
    html = client.get(reverse("home")).content.decode()
    assert f'href="{reverse("login")}' in html
    assert "Log out" not in html


def test_login_page_logs_a_researcher_in(client, researcher):
    from tests.factories import PASSWORD

    assert client.get(reverse("login")).status_code == 200
    response = client.post(reverse("login"), {"username": researcher.username, "password": PASSWORD})
    assert response.status_code == 302
    assert client.session["_auth_user_id"] == str(researcher.pk)


def test_detail_page_query_count_does_not_grow_with_the_number_of_items(client, researcher,
                                                                        django_assert_max_num_queries):
    small, large = BenchmarkFactory(), BenchmarkFactory()
    BenchmarkItemFactory.create_batch(5, benchmark=small)
    BenchmarkItemFactory.create_batch(30, benchmark=large)
    client.force_login(researcher)
    client.get(small.get_absolute_url())  # warm up per-process caches (content types, etc.)

    with CaptureQueriesContext(connection) as small_queries:
        assert client.get(small.get_absolute_url()).status_code == 200
    with django_assert_max_num_queries(len(small_queries)):
        assert client.get(large.get_absolute_url()).status_code == 200
    with django_assert_max_num_queries(len(small_queries)):
        assert client.get(large.get_absolute_url(), {"page": 2, "domain": Domain.ARTS}).status_code == 200


def test_list_page_query_count_does_not_grow_with_the_number_of_benchmarks(client, researcher,
                                                                         django_assert_max_num_queries):
    BenchmarkItemFactory()
    client.force_login(researcher)
    with CaptureQueriesContext(connection) as one:
        client.get(reverse("pipeline:benchmark-list"))
    BenchmarkItemFactory.create_batch(10)
    with django_assert_max_num_queries(len(one)):
        client.get(reverse("pipeline:benchmark-list"))
