"""A re-annotation campaign's default guidelines (annotators read them) give no reason the pairs
were picked: "reward models disagree with the label" tells a rater which answer to doubt."""

from leaderboard.health_views import REANNOTATION_GUIDELINES, ReannotationForm


def test_the_default_reannotation_guidelines_do_not_say_why_the_pairs_were_picked():
    text = REANNOTATION_GUIDELINES.lower()
    for hint in ("flag", "disagree", "label", "reward model", "suspect", "health", "wrong"):
        assert hint not in text, hint
    assert ReannotationForm().fields["guidelines"].initial == REANNOTATION_GUIDELINES
    assert "Personal Rubrics" in REANNOTATION_GUIDELINES
