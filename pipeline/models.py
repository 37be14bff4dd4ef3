from django.conf import settings
from django.core.validators import RegexValidator
from django.db import models
from django.db.models import F, Q
from django.urls import reverse

from . import domains


class Domain(models.TextChoices):
    ARTS = domains.ARTS, domains.LABELS[domains.ARTS]
    LIFESTYLE = domains.LIFESTYLE, domains.LABELS[domains.LIFESTYLE]
    SOCIETY = domains.SOCIETY, domains.LABELS[domains.SOCIETY]


benchmark_name_validator = RegexValidator(
    r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
    "Use letters, digits, '.', '_' and '-' (it appears in URLs and on the command line).",
)


class Benchmark(models.Model):
    """A named, versioned set of chosen/rejected pairs.

    `content_hash` is a sha256 over the canonical rows, so the same content imported
    from any format hashes the same. Once anything references the benchmark (an
    evaluation run, an annotation campaign) it is frozen: its items no longer change.
    """

    class Source(models.TextChoices):
        IMPORTED = "imported", "Imported from a file"
        BUILT = "built", "Built by the pipeline"

    name = models.CharField(max_length=100, unique=True, validators=[benchmark_name_validator])
    description = models.TextField(blank=True)
    source = models.CharField(max_length=16, choices=Source.choices, default=Source.IMPORTED)
    content_hash = models.CharField(max_length=64, blank=True, db_index=True,
                                    help_text="sha256 of the canonical rows; empty while an import is in progress.")
    metadata = models.JSONField(default=dict, blank=True,
                                help_text="Free-form facts about the data, e.g. {\"synthetic\": true, \"license\": ...}.")
    item_count = models.PositiveIntegerField(default=0)
    stats = models.JSONField(null=True, blank=True, help_text="Computed by the benchmark-statistics task.")
    stats_computed_at = models.DateTimeField(null=True, blank=True)
    frozen_at = models.DateTimeField(null=True, blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at", "name"]
        constraints = [
            models.UniqueConstraint(fields=["content_hash"], condition=~Q(content_hash=""),
                                    name="benchmark_unique_content"),
        ]

    def __str__(self) -> str:
        return self.name

    def get_absolute_url(self) -> str:
        return reverse("pipeline:benchmark-detail", args=[self.name])

    @property
    def is_frozen(self) -> bool:
        return self.frozen_at is not None

    @property
    def is_synthetic(self) -> bool:
        return bool(self.metadata.get("synthetic"))


class BenchmarkItem(models.Model):
    """One pair: a user's question and ranked profile, the answer key (narrative and
    rubric aspects, never shown to a reward model) and the chosen/rejected answers."""

    benchmark = models.ForeignKey(Benchmark, on_delete=models.CASCADE, related_name="items")
    position = models.PositiveIntegerField(help_text="Order in the source file(s), from 0.")
    source_id = models.CharField(max_length=200)
    source_id_is_int = models.BooleanField(default=False, help_text="The source wrote the id as a number.")
    domain = models.CharField(max_length=40, choices=Domain.choices, db_index=True)
    category = models.CharField(max_length=100, help_text="The category string as the source wrote it.")
    question = models.TextField()
    profile = models.JSONField(default=list, blank=True,
                               help_text="Past posts, most relevant first: [{id, text, category}].")
    narrative = models.TextField(blank=True)
    rubric_aspects = models.JSONField(default=list, blank=True, help_text="[{aspect, evidence, reason}]")
    chosen = models.TextField()
    rejected = models.TextField()
    extra = models.JSONField(default=dict, blank=True, help_text="Source fields outside the schema, kept for export.")
    validation = models.JSONField(null=True, blank=True,
                                  help_text="Human validation verdict: {valid, reasons, source}; set by annotation.")
    plan = models.JSONField(default=list, blank=True,
                            help_text="Planner aspects (strings) for the `plan` setting; written by the planner.")

    class Meta:
        ordering = ["benchmark", "position"]
        constraints = [
            models.UniqueConstraint(fields=["benchmark", "source_id"], name="item_unique_source_id"),
            models.UniqueConstraint(fields=["benchmark", "position"], name="item_unique_position"),
            models.CheckConstraint(condition=~Q(chosen=F("rejected")), name="item_chosen_differs_from_rejected"),
            models.CheckConstraint(condition=~Q(chosen="") & ~Q(rejected=""), name="item_answers_not_empty"),
            models.CheckConstraint(condition=Q(domain__in=Domain.values), name="item_domain_valid"),
        ]

    def __str__(self) -> str:
        return f"{self.benchmark.name}:{self.source_id}"

    def get_absolute_url(self) -> str:
        return reverse("pipeline:item-detail", args=[self.benchmark.name, self.pk])
