import hashlib
import unicodedata

from django.conf import settings
from django.core.validators import RegexValidator
from django.db import models
from django.db.models import F, Q
from django.urls import reverse

from jobs.models import Job, JobStatus

from . import domains


class Domain(models.TextChoices):
    ARTS = domains.ARTS, domains.LABELS[domains.ARTS]
    LIFESTYLE = domains.LIFESTYLE, domains.LABELS[domains.LIFESTYLE]
    SOCIETY = domains.SOCIETY, domains.LABELS[domains.SOCIETY]
    PRISM = domains.PRISM, domains.LABELS[domains.PRISM]
    ARENA = domains.ARENA, domains.LABELS[domains.ARENA]


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

    class Kind(models.TextChoices):
        PROFILE_RUBRIC = "profile_rubric", "Profile and personal rubric (Personalized RewardBench)"
        PAIR_HISTORY = "pair_history", "Earlier preference pairs (PersonalRewardBench-style)"

    name = models.CharField(max_length=100, unique=True, validators=[benchmark_name_validator])
    description = models.TextField(blank=True)
    kind = models.CharField(max_length=16, choices=Kind.choices, default=Kind.PROFILE_RUBRIC)
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


def pair_key(chosen: str, rejected: str) -> str:
    """The content key of a pair (64 hex characters): SHA-256 of its two answers, each NFKC-
    normalised, case-folded and with runs of whitespace made one space, in sorted order.

    What an annotator sees of a pair is its two answers; any item holding the same two answers
    (under another benchmark's name or version, with another id, question or profile, or with
    the labels swapped) tells which of them is chosen, so blindness is keyed on this, not on a
    benchmark id (pipeline/blindness.py)."""
    def norm(text: str) -> str:
        return " ".join(unicodedata.normalize("NFKC", text or "").casefold().split())

    first, second = sorted((norm(chosen), norm(rejected)))
    return hashlib.sha256(f"{len(first)}:{first}\n{second}".encode()).hexdigest()


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
    user_id = models.CharField(max_length=200, blank=True, help_text="Pair-history rows: the user.")
    history = models.JSONField(null=True, blank=True,
                               help_text="Pair-history rows: earlier preferences [{prompt, chosen, rejected}].")
    validation = models.JSONField(null=True, blank=True,
                                  help_text="Human validation verdict: {valid, reasons, source}; set by annotation.")
    plan = models.JSONField(default=list, blank=True,
                            help_text="Planner aspects (strings) for the `plan` setting; written by the planner.")
    pair_key = models.CharField(max_length=64, blank=True, db_index=True,
                                help_text="pair_key(chosen, rejected): the same pair in any benchmark has the same key.")

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

    def save(self, *args, **kwargs):
        self.pair_key = pair_key(self.chosen, self.rejected)
        super().save(*args, **kwargs)

    def get_absolute_url(self) -> str:
        return reverse("pipeline:item-detail", args=[self.benchmark.name, self.pk])


class PerPairRead(models.Model):
    """That a user was served per-pair data of a benchmark (pipeline/blindness.py): model pair
    pages, per-pair exports and API, comparisons, the items API (`pair_key` blank: every pair of
    the benchmark) or one item page (`pair_key` of that pair). Checked when a pair is leased
    for blind rating: nobody rates a pair whose answer key they were shown."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    benchmark = models.ForeignKey(Benchmark, on_delete=models.CASCADE, related_name="+")
    pair_key = models.CharField(max_length=64, blank=True, help_text="One pair's key; blank: every pair.")
    what = models.CharField(max_length=60, help_text="What was read first, e.g. 'model predictions'.")
    first_read_at = models.DateTimeField(auto_now_add=True)
    last_read_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["user", "benchmark", "pair_key"], name="per_pair_read_once")]


class HistoryRow(models.Model):
    """A PersonalRewardBench row outside the test split (train or val) of an imported benchmark: not an
    item (never scored), but the material test items' histories are sampled from and prototypes are
    built from. `row` is the source row exactly as read (export writes it back)."""

    benchmark = models.ForeignKey(Benchmark, on_delete=models.CASCADE, related_name="history_rows")
    position = models.PositiveIntegerField(help_text="Order in the source file(s), from 0 (shared with the items).")
    split = models.CharField(max_length=8, help_text="train or val")
    user_id = models.CharField(max_length=200, db_index=True)
    row = models.JSONField()

    class Meta:
        ordering = ["benchmark", "position"]
        constraints = [models.UniqueConstraint(fields=["benchmark", "position"], name="historyrow_unique_position")]

    def __str__(self) -> str:
        return f"{self.benchmark.name}:{self.split}:{self.position}"


class LLMEndpoint(models.Model):
    """An OpenAI-compatible endpoint configured by staff (vLLM, SGLang, TGI, a hosted API),
    used by generative judges and by the construction pipeline's generator and planner.

    The key itself never enters the database or a form: `api_key_env` names the
    environment variable that holds it on the workers."""

    name = models.SlugField(unique=True)
    base_url = models.URLField()
    api_key_env = models.CharField(max_length=100, blank=True,
                                   help_text="Name of the environment variable holding the API key on the workers.")
    timeout_seconds = models.PositiveIntegerField(default=120, help_text="Seconds one HTTP attempt may take.")
    deadline_seconds = models.PositiveIntegerField(
        default=0, help_text="Seconds one request may take with all its retries and waits (0: twice the timeout). "
                             "It bounds how long a job waits on each wave of requests to a hanging endpoint.")
    max_retries = models.PositiveSmallIntegerField(default=4, help_text="Retries on 429, 5xx and timeouts, with "
                                                                         "exponential backoff.")
    max_concurrency = models.PositiveIntegerField(default=4)
    price_prompt_per_1k = models.DecimalField(max_digits=10, decimal_places=6, default=0)
    price_completion_per_1k = models.DecimalField(max_digits=10, decimal_places=6, default=0)
    response_format = models.CharField(
        max_length=12, default="json_schema",
        choices=[("json_schema", "JSON schema"), ("json_object", "any JSON object"), ("none", "not supported")],
        help_text="How to ask for JSON answers (the planner's). Set to 'not supported' automatically the first "
                  "time the server answers 400 about response_format.")
    # What the server takes, set by staff and learned from a 400 naming the parameter (see
    # llm.OpenAIChatBackend): hosted reasoning models want max_completion_tokens and refuse
    # temperatures other than 1, some servers refuse seed or n.
    token_parameter = models.CharField(
        max_length=24, default="max_tokens",
        choices=[("max_tokens", "max_tokens"), ("max_completion_tokens", "max_completion_tokens")],
        help_text="The name the server takes for the answer's token budget. Switched automatically the first time "
                  "the server answers 400 naming the other one.")
    accepts_temperature = models.BooleanField(
        default=True, help_text="Off: temperature is not sent (the server's default, 1, applies). Turned off "
                                "automatically the first time the server refuses a temperature.")
    accepts_seed = models.BooleanField(default=True, help_text="Off: no seed is sent (answers are not reproducible). "
                                                               "Turned off automatically when the server refuses it.")
    accepts_n = models.BooleanField(default=True, help_text="Off: N answers are asked as N requests. Turned off "
                                                            "automatically when the server refuses n.")
    reasoning_effort = models.CharField(
        max_length=8, blank=True, default="",
        choices=[("", "not sent"), ("minimal", "minimal"), ("low", "low"), ("medium", "medium"), ("high", "high")],
        help_text="Sent as reasoning_effort to reasoning models; cleared automatically when the server refuses it.")
    allowed_models = models.JSONField(
        default=list, blank=True,
        help_text="The model names researchers may choose at this endpoint (a JSON list). Empty: any name, for a "
                  "server that serves only the operator's models; set it for a hosted API, whose key bills every "
                  "model it knows.")
    # Spend caps (None: no cap): checked against an estimate before a run starts and after every
    # chunk while it runs; a run reaching one stops with the reason, its scored pairs kept.
    max_requests_per_run = models.PositiveIntegerField(null=True, blank=True, help_text="Requests one run may send.")
    max_tokens_per_run = models.PositiveBigIntegerField(null=True, blank=True,
                                                        help_text="Prompt plus completion tokens one run may use.")
    max_cost_per_run = models.DecimalField(max_digits=12, decimal_places=4, null=True, blank=True,
                                           help_text="What one run may cost, in the prices' unit.")
    max_requests_per_day = models.PositiveIntegerField(null=True, blank=True,
                                                       help_text="Requests one researcher's runs may send per UTC day.")
    max_tokens_per_day = models.PositiveBigIntegerField(null=True, blank=True,
                                                        help_text="Tokens one researcher's runs may use per UTC day.")
    max_cost_per_day = models.DecimalField(max_digits=12, decimal_places=4, null=True, blank=True,
                                           help_text="What one researcher's runs may cost per UTC day.")
    enabled = models.BooleanField(default=True)

    class Meta:
        verbose_name = "LLM endpoint"

    def __str__(self) -> str:
        return self.name


class EndpointSpend(models.Model):
    """What one researcher's runs spent at one endpoint on one UTC day: the ledger the per-day
    spend caps are checked against (pipeline/endpoints.py, `spend_record`)."""

    endpoint = models.ForeignKey(LLMEndpoint, on_delete=models.CASCADE, related_name="+")
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    day = models.DateField()
    requests = models.PositiveBigIntegerField(default=0)
    tokens = models.PositiveBigIntegerField(default=0)
    cost = models.FloatField(default=0.0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["endpoint", "owner", "day"], name="endpoint_spend_once")]


class PromptTemplate(models.Model):
    """A versioned prompt for the generator or the planner. Saving a change from the admin
    writes a new version; items keep the version that produced them."""

    class Purpose(models.TextChoices):
        CHOSEN = "chosen", "Answer following the rubric"
        AVOID = "avoid", "Answer avoiding the rubric"
        PLANNER = "planner", "Planner aspects"

    name = models.SlugField(max_length=60)
    purpose = models.CharField(max_length=10, choices=Purpose.choices)
    version = models.PositiveIntegerField(default=1)
    system = models.TextField(blank=True)
    user = models.TextField(help_text="A jinja2 template, rendered in a sandbox: {{ question }}, {{ profile }}, "
                                      "{{ aspects }} (not for the planner), {{ target_words }}.")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["purpose", "name", "-version"]
        constraints = [models.UniqueConstraint(fields=["name", "version"], name="template_unique_version")]

    def __str__(self) -> str:
        return f"{self.name} v{self.version}"


BuildStatus = JobStatus  # the name builds' statuses had before every kind shared one lifecycle


class BuildRun(Job):
    """Turning LaMP-QA users into a new benchmark version: import, retrieve, generate, plan.
    Units: each BuildItem through each stage."""

    job_type = "build"
    job_task = "gpu.pipeline.run_build"
    job_owner = "created_by"

    name = models.CharField(max_length=100, validators=[benchmark_name_validator],
                            help_text="Name of the benchmark this build creates.")
    source_path = models.CharField(max_length=500, help_text="LaMP-QA file or folder under DATA_ROOT.")
    domains = models.JSONField(default=list, blank=True, help_text="Domains to keep (empty: all).")
    split = models.CharField(max_length=40, blank=True, help_text="Keep files whose name contains this (e.g. test).")
    limit = models.PositiveIntegerField(null=True, blank=True)
    profile_k = models.PositiveSmallIntegerField(default=10)
    retriever = models.CharField(max_length=300, blank=True,
                                 help_text="Encoder folder or cached Hub id; empty: the bundled all-MiniLM-L6-v2.")
    generator = models.ForeignKey(LLMEndpoint, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    generator_model = models.CharField(max_length=300, help_text="Model name at the endpoint, or a causal-LM "
                                                                  "folder under MODELS_ROOT when no endpoint.")
    planner = models.ForeignKey(LLMEndpoint, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    planner_model = models.CharField(max_length=300, blank=True, help_text="Empty: no planner stage.")
    chosen_template = models.ForeignKey(PromptTemplate, on_delete=models.PROTECT, related_name="+")
    avoid_templates = models.ManyToManyField(PromptTemplate, related_name="+")
    planner_template = models.ForeignKey(PromptTemplate, null=True, blank=True, on_delete=models.PROTECT,
                                         related_name="+")
    temperature = models.FloatField(default=0.7)
    seed = models.IntegerField(default=0)
    length_ratio_min = models.FloatField(default=0.8)
    length_ratio_max = models.FloatField(default=1.25)
    skip_failed = models.BooleanField(default=False, help_text="Finish with the items that succeeded even if some "
                                                                "failed (otherwise the build waits for a resume).")
    counts = models.JSONField(default=dict, blank=True, help_text="Items per stage: total, retrieved, generated, "
                                                                   "planned, failed; failed_by_reason.")
    progress_text = models.CharField(max_length=300, blank=True, help_text="What the build is doing or waiting for "
                                                                            "now (e.g. a server-directed wait).")
    tokens = models.JSONField(default=dict, blank=True)
    benchmark = models.OneToOneField(Benchmark, null=True, blank=True, on_delete=models.SET_NULL, related_name="build")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"build {self.name} ({self.status})"

    def get_absolute_url(self) -> str:
        return reverse("pipeline:build-detail", args=[self.pk])

    def job_title(self) -> str:
        return f"Build of {self.name}"

    def job_url(self) -> str:
        return self.get_absolute_url()

    def job_retry_refusal(self) -> str:
        return "the build already produced its benchmark" if self.benchmark_id else ""

    def job_reset_for_retry(self) -> None:
        """Failed items get another try (answers already paid for come from the cache)."""
        self.items.exclude(error="").update(error="", error_stage="", error_reason="")


class BuildItem(models.Model):
    """One LaMP-QA user question moving through the stages; a rerun only does what is missing."""

    build = models.ForeignKey(BuildRun, on_delete=models.CASCADE, related_name="items")
    position = models.PositiveIntegerField()
    source_id = models.CharField(max_length=200)
    source_id_is_int = models.BooleanField(default=False)
    domain = models.CharField(max_length=40, choices=Domain.choices)
    category = models.CharField(max_length=100)
    question = models.TextField()
    narrative = models.TextField(blank=True)
    rubric_aspects = models.JSONField(default=list)
    profile = models.JSONField(default=list, help_text="All past posts, as in the source (unranked).")
    ranked_profile = models.JSONField(null=True, blank=True, help_text="Top-k posts, most relevant first.")
    chosen = models.TextField(blank=True)
    rejected = models.TextField(blank=True)
    avoid_template = models.ForeignKey(PromptTemplate, null=True, blank=True, on_delete=models.PROTECT,
                                       related_name="+")
    plan = models.JSONField(null=True, blank=True)
    outputs = models.JSONField(default=dict, blank=True, help_text="Raw outputs, tokens, length ratio, attempts.")
    error_stage = models.CharField(max_length=20, blank=True)
    error_reason = models.CharField(max_length=20, blank=True, help_text="truncated, refused, unparseable, "
                                                                         "rate_limited, timed_out, cancelled or error.")
    error = models.TextField(blank=True)

    class Meta:
        ordering = ["build", "position"]
        constraints = [models.UniqueConstraint(fields=["build", "source_id"], name="builditem_unique_source")]


class PolicySampleSet(Job):
    """N answers per benchmark question from one policy, sampled once and reused by every
    reward model's Best-of-N evaluation. Units: each item's N PolicySamples. Staff-only."""

    job_type = "sampling"
    job_task = "gpu.pipeline.sample_policy"
    job_related = ("benchmark",)

    benchmark = models.ForeignKey(Benchmark, on_delete=models.PROTECT, related_name="sample_sets")
    policy = models.CharField(max_length=200, default="Qwen2.5-0.5B-Instruct", help_text="Name shown in results.")
    endpoint = models.ForeignKey(LLMEndpoint, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    model = models.CharField(max_length=300, help_text="Model name at the endpoint, or a causal-LM folder under "
                                                        "MODELS_ROOT.")
    n = models.PositiveSmallIntegerField(default=16)
    temperature = models.FloatField(default=0.8)
    top_p = models.FloatField(null=True, blank=True, help_text="Nucleus sampling; empty: not sent (the endpoint's "
                                                               "default, 1).")
    max_tokens = models.PositiveIntegerField(default=256)
    seed = models.IntegerField(default=0)
    failed_items = models.JSONField(default=dict, blank=True, help_text="{source id: reason}")
    usage = models.JSONField(default=dict, blank=True, help_text=(
        "Requests, requests_without_usage, tokens, cost (null when unknown), cache hits; degenerate_retried: items "
        "whose samples were at most half distinct and were asked again one sample per request; degenerate_items: "
        "items whose samples stayed so (kept)."))

    def __str__(self) -> str:
        return f"{self.policy} x{self.n} on {self.benchmark.name}"

    def job_title(self) -> str:
        return f"Policy samples: {self}"


class PolicySample(models.Model):
    sample_set = models.ForeignKey(PolicySampleSet, on_delete=models.CASCADE, related_name="samples")
    item = models.ForeignKey(BenchmarkItem, on_delete=models.PROTECT, related_name="+")
    index = models.PositiveSmallIntegerField()
    text = models.TextField()

    class Meta:
        ordering = ["sample_set", "item", "index"]
        constraints = [models.UniqueConstraint(fields=["sample_set", "item", "index"], name="sample_unique_index")]
