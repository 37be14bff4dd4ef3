"""Roles, login/logout and the admin pages."""

import pytest
from django.contrib.auth.models import Group

from core.roles import has_role
from tests.factories import PASSWORD, BenchmarkItemFactory

pytestmark = pytest.mark.django_db


def test_the_role_groups_exist_after_migrations():
    assert set(Group.objects.values_list("name", flat=True)) >= {"annotator", "researcher"}


def test_staff_have_every_role_and_members_only_their_own(researcher, annotator, staff_user):
    assert has_role(researcher, "researcher") and not has_role(researcher, "annotator")
    assert has_role(annotator, "annotator") and not has_role(annotator, "researcher")
    assert has_role(staff_user, "researcher") and has_role(staff_user, "annotator")


def test_login_and_logout_pages_work(client, researcher):
    assert client.get("/accounts/login/").status_code == 200
    response = client.post("/accounts/login/", {"username": researcher.username, "password": PASSWORD})
    assert response.status_code == 302
    assert client.get("/").context["user"] == researcher
    assert client.get("/accounts/logout/").status_code == 405  # logout only by POST (CSRF-protected)
    client.post("/accounts/logout/")
    assert not client.get("/").context["user"].is_authenticated


def test_admin_pages_list_and_show_benchmark_data(client, staff_user):
    item = BenchmarkItemFactory()
    client.force_login(staff_user)
    for url in ("/admin/", "/admin/pipeline/benchmark/", f"/admin/pipeline/benchmark/{item.benchmark.pk}/change/",
                "/admin/pipeline/benchmarkitem/", f"/admin/pipeline/benchmarkitem/{item.pk}/change/"):
        assert client.get(url).status_code == 200, url


def test_the_admin_is_titled_for_the_product(client, staff_user):
    client.force_login(staff_user)
    html = client.get("/admin/").content.decode()
    assert "prbench administration" in html and "Django administration" not in html
    assert "<title>Benchmarks, campaigns, submissions and jobs | prbench admin</title>" in html
    assert "Best-of-N runs" in html and "PPO runs" in html  # not Django's "Best of n runs", "Ppo runs"
    assert "Best of n runs" not in html and "Ppo runs" not in html


def test_admin_cannot_edit_items_or_delete_frozen_benchmarks(client, staff_user):
    from pipeline.services import benchmark_freeze

    item = BenchmarkItemFactory()
    benchmark_freeze(benchmark=item.benchmark)
    client.force_login(staff_user)
    response = client.post(f"/admin/pipeline/benchmarkitem/{item.pk}/change/", {"question": "edited"})
    assert response.status_code == 403
    item.refresh_from_db()
    assert item.question != "edited"
    assert client.post(f"/admin/pipeline/benchmark/{item.benchmark.pk}/delete/", {"post": "yes"}).status_code == 403


def test_non_staff_are_kept_out_of_the_admin(client, researcher):
    client.force_login(researcher)
    response = client.get("/admin/pipeline/benchmark/")
    assert response.status_code == 403 and b"not a staff account" in response.content


def test_a_refused_page_explains_which_role_is_missing(client, annotator):
    client.force_login(annotator)
    response = client.get("/benchmarks/")
    assert response.status_code == 403
    assert b"needs the researcher role" in response.content and b"prbench" in response.content
