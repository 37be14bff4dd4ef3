"""Template filters a page cannot afford to crash in (a 500 for one missing figure)."""

from django.template import Context, Template

from leaderboard.templatetags.leaderboard_tags import pct


def test_pct_shows_a_dash_for_anything_that_is_not_a_finite_number():
    assert [pct(v) for v in (0.7594, 1, 0, "0.5")] == ["75.9", "100.0", "0.0", "50.0"]
    assert pct(0.12345, 2) == "12.35"
    assert [pct(v) for v in (None, "", "n/a", float("nan"), float("inf"), {})] == ["—"] * 6


def test_pct_of_a_missing_variable_renders_a_dash():
    # A lookup that fails gives the filter '' (string_if_invalid): the page shows a dash, not a 500.
    html = Template("{% load leaderboard_tags %}[{{ run.metrics.ci_low|pct }}]").render(Context({"run": {}}))
    assert html == "[—]"
