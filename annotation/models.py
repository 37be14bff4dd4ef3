from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import Q
from django.urls import reverse

from pipeline.models import Benchmark, BenchmarkItem

DIMENSIONS = ("factuality", "relevance", "helpfulness", "personal_rubrics")


def default_dimensions() -> list[dict]:
    """The four dimensions of the published study, with labelled anchors for 1..5."""
    return [
        {"key": "factuality", "label": "Factuality", "question": "Is the answer accurate and free of errors?",
         "anchors": {"1": "Mostly wrong", "2": "Several errors", "3": "Minor errors", "4": "Accurate",
                     "5": "Fully accurate"}},
        {"key": "relevance", "label": "Relevance", "question": "Does it address the question that was asked?",
         "anchors": {"1": "Off topic", "2": "Mostly off topic", "3": "Partly relevant", "4": "Relevant",
                     "5": "Squarely on point"}},
        {"key": "helpfulness", "label": "Helpfulness", "question": "Would it help someone asking this?",
         "anchors": {"1": "Not helpful", "2": "Slightly", "3": "Somewhat", "4": "Helpful", "5": "Very helpful"}},
        {"key": "personal_rubrics", "label": "Personal Rubrics",
         "question": "Does it meet the rubric aspects of THIS person (shown above)?",
         "anchors": {"1": "Ignores them", "2": "Touches one", "3": "Meets some", "4": "Meets most",
                     "5": "Meets all"}},
    ]


class Campaign(models.Model):
    """Blind human validation of one benchmark version."""

    name = models.CharField(max_length=120)
    benchmark = models.ForeignKey(Benchmark, on_delete=models.PROTECT, related_name="campaigns")
    guidelines = models.TextField(help_text="Markdown, shown before the first pair and on demand.")
    overlap = models.PositiveSmallIntegerField(default=3, validators=[MinValueValidator(1), MaxValueValidator(20)],
                                               help_text="How many people rate each pair.")
    dimensions = models.JSONField(default=default_dimensions)
    target_per_annotator = models.PositiveIntegerField(null=True, blank=True,
                                                       help_text="Pairs each annotator is asked for (empty: all).")
    lease_minutes = models.PositiveIntegerField(default=30)
    rubric_min_diff = models.FloatField(default=2.0, help_text="Valid pair: Personal Rubrics chosen minus rejected "
                                                               "at least this much.")
    other_max_diff = models.FloatField(default=1.0, help_text="Valid pair: every other dimension differs by less.")
    is_open = models.BooleanField(default=True)
    strata = models.JSONField(default=list, blank=True,
                              help_text="Pairs per domain, indexed by CampaignPair.domain_index (for the order).")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    assignees = models.ManyToManyField(settings.AUTH_USER_MODEL, blank=True, related_name="assigned_campaigns",
                                       help_text="Annotators who may rate it (with assignee_groups; none of either: "
                                                 "every annotator).")
    assignee_groups = models.ManyToManyField("auth.Group", blank=True, related_name="assigned_campaigns",
                                             help_text="Groups whose members may rate it.")
    origin = models.JSONField(default=dict, blank=True, help_text=(
        "Where its pairs came from: empty for every pair of the benchmark; for a re-annotation opened from the "
        "benchmark's health page {from: 'benchmark health', benchmark, flag, pairs: [source ids], selected_by, "
        "health_key}."))

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return self.name

    def get_absolute_url(self) -> str:
        return reverse("annotation:report", args=[self.pk])

    @property
    def dimension_keys(self) -> list[str]:
        return [d["key"] for d in self.dimensions]


class CampaignReportCache(models.Model):
    """The campaign report's statistics as last computed (`campaign_report`), and the key of
    what they were computed from (ratings, revisions, thresholds, statistics version).

    A table of its own, not columns of Campaign: the statistics grow with the pairs rated
    (about 250 bytes of JSON a pair), and every request that loads a campaign (a rating
    submit, a skip, a revision) would otherwise read and parse them."""

    campaign = models.OneToOneField(Campaign, on_delete=models.CASCADE, primary_key=True,
                                    related_name="report_cache")
    key = models.CharField(max_length=64, help_text="What the statistics were computed from.")
    # JSON as text, not a JSONField: PostgreSQL's jsonb stores an object's keys sorted, so the
    # dimensions and annotators would come back in another order than a fresh computation's.
    statistics = models.TextField(help_text="campaign_statistics() at `key`, as JSON text.")
    computed_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"report of campaign {self.campaign_id}"


class CampaignPair(models.Model):
    """A benchmark pair inside a campaign. `taken` counts live leases plus submitted ratings
    and is only changed by conditional UPDATEs, so it can never pass the overlap; the pair
    is complete when its ratings reach the overlap."""

    campaign = models.ForeignKey(Campaign, on_delete=models.CASCADE, related_name="pairs")
    item = models.ForeignKey(BenchmarkItem, on_delete=models.PROTECT, related_name="+")
    taken = models.PositiveSmallIntegerField(default=0)
    is_gold = models.BooleanField(default=False)
    domain_index = models.PositiveSmallIntegerField(default=0, help_text="Index of the pair's domain in "
                                                                         "Campaign.strata.")
    stratum_round = models.PositiveIntegerField(default=0, help_text="Place in a campaign-seeded shuffle of its "
                                                                     "domain's pairs (0-based).")
    gold_expected = models.JSONField(null=True, blank=True,
                                     help_text='{"chosen": {dimension: 1-5}, "rejected": {...}}')

    class Meta:
        constraints = [models.UniqueConstraint(fields=["campaign", "item"], name="campaignpair_unique_item")]
        indexes = [models.Index(fields=["campaign", "taken"])]


class Assignment(models.Model):
    """One annotator's hold on one pair. The opaque token is all the annotator ever sees."""

    class Status(models.TextChoices):
        LEASED = "leased"
        SUBMITTED = "submitted"
        SKIPPED = "skipped"
        EXPIRED = "expired"

    token = models.CharField(max_length=32, unique=True)
    campaign = models.ForeignKey(Campaign, on_delete=models.CASCADE, related_name="assignments",
                                 help_text="The pair's campaign (kept here so the database can allow one live "
                                           "lease per annotator and campaign).")
    pair = models.ForeignKey(CampaignPair, on_delete=models.CASCADE, related_name="assignments")
    annotator = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="assignments")
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.LEASED)
    chosen_first = models.BooleanField(help_text="Response 1 is the chosen answer (an HMAC under SECRET_KEY).")
    leased_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    skip_reason = models.TextField(blank=True)
    flagged = models.BooleanField(default=False)
    skipped_at = models.DateTimeField(null=True, blank=True, help_text="When the annotator last skipped it.")
    # The annotator's unsent work on the pair, by shown position only ({"ratings": {"1": {...},
    # "2": {...}}, "comment", "flag", "flag_reason", "seconds"}): the rating screen saves it as
    # they go and restores it in any browser; a submit or skip clears it in the same UPDATE.
    draft = models.JSONField(null=True, blank=True)
    draft_saved_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["pair", "annotator"], name="assignment_unique_annotator"),
            # Two tabs or a double click asking at once get one lease, enforced by a partial
            # unique index (PostgreSQL and SQLite alike).
            models.UniqueConstraint(fields=["campaign", "annotator"], condition=Q(status="leased"),
                                    name="assignment_one_live_lease"),
        ]
        indexes = [models.Index(fields=["annotator", "status"]), models.Index(fields=["status", "expires_at"]),
                   models.Index(fields=["campaign", "annotator", "status"])]


class Rating(models.Model):
    """One annotator's ratings of one pair, stored by the responses' roles (never by screen position)."""

    assignment = models.OneToOneField(Assignment, on_delete=models.CASCADE, related_name="rating")
    campaign = models.ForeignKey(Campaign, on_delete=models.CASCADE, related_name="ratings")
    item = models.ForeignKey(BenchmarkItem, on_delete=models.PROTECT, related_name="+")
    annotator = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="ratings")
    chosen = models.JSONField(help_text="{dimension: 1-5} for the chosen answer")
    rejected = models.JSONField(help_text="{dimension: 1-5} for the rejected answer")
    comment = models.TextField(blank=True)
    flag_reason = models.TextField(blank=True)
    seconds = models.FloatField(null=True, help_text="Active time on the pair.")
    created_at = models.DateTimeField(auto_now_add=True)
    revised_at = models.DateTimeField(null=True, blank=True, help_text="Last revision by the annotator.")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["campaign", "item", "annotator"], name="rating_one_per_annotator"),
            models.CheckConstraint(condition=Q(seconds__isnull=True) | Q(seconds__gte=0), name="rating_seconds_ok"),
        ]


class RatingRevision(models.Model):
    """An earlier version of a rating, kept when its annotator revises it. The Rating row
    always holds the latest version, which is what reports use."""

    rating = models.ForeignKey(Rating, on_delete=models.CASCADE, related_name="revisions")
    chosen = models.JSONField()
    rejected = models.JSONField()
    comment = models.TextField(blank=True)
    flag_reason = models.TextField(blank=True)
    seconds = models.FloatField(null=True)
    rated_at = models.DateTimeField(help_text="When this version was given.")
    replaced_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["rating", "pk"]
