import re

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.urls import reverse

from jobs.models import Job, JobStatus
from pipeline.models import Benchmark, BenchmarkItem, LLMEndpoint
from prblib import registry

# A snapshot folder in the Hugging Face Hub cache: .../models--<org>--<name>/snapshots/<revision>
HUB_SNAPSHOT = re.compile(r"models--(?P<org>[^/]+?)--(?P<name>[^/]+)/snapshots/(?P<revision>[0-9a-f]+)/?$")

RunStatus = JobStatus  # the name these models' statuses had before every kind shared one lifecycle


def _choices(name: str, entries) -> type[models.TextChoices]:
    """Django choices built from registry entries: member NAME.upper() = (name, label), so the
    stored values and labels are the registry's and `Kind.SCALAR`-style names keep working."""
    return models.TextChoices(name, [(e.name.upper(), (e.name, e.label)) for e in entries])


# The vocabulary is declared once, in prblib.registry; these are its Django views.
Kind = _choices("Kind", registry.KINDS)
Setting = _choices("Setting", registry.SETTINGS)


class Dtype(models.TextChoices):
    AUTO = "auto", "auto (float32 on CPU, bfloat16 on GPU)"
    FLOAT32 = "float32", "float32"
    BFLOAT16 = "bfloat16", "bfloat16"
    FLOAT16 = "float16", "float16"


STAFF_OWNER = "prbench staff"  # the owner non-staff read for a submission a staff member made


class Submission(models.Model):
    """A reward model submitted for evaluation on one benchmark, in one or more settings."""

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="submissions")
    display_name = models.CharField(max_length=120)
    benchmark = models.ForeignKey(Benchmark, on_delete=models.PROTECT, related_name="submissions")
    kind = models.CharField(max_length=16, choices=Kind.choices)
    model_path = models.CharField(max_length=500, blank=True,
                                  help_text="Folder under MODELS_ROOT (or the model name at a judge backend).")
    judge_backend = models.ForeignKey(LLMEndpoint, null=True, blank=True, on_delete=models.PROTECT,
                                      related_name="+", help_text="Staff-configured endpoint serving the judge.")
    scores_file = models.FileField(upload_to="scores/", blank=True)
    weights_hash = models.CharField(max_length=64, db_index=True,
                                    help_text="sha256 of the weights (or scores file, or backend and model name).")
    dtype = models.CharField(max_length=10, choices=Dtype.choices, default=Dtype.AUTO)
    max_length = models.PositiveIntegerField(default=4096)
    batch_size = models.PositiveIntegerField(default=8)
    profile_k = models.PositiveSmallIntegerField(default=10)
    options = models.JSONField(default=dict, blank=True)
    parameters = models.BigIntegerField(null=True, blank=True, help_text="Parameter count.")
    license = models.CharField(max_length=100, blank=True)
    link = models.URLField(blank=True)
    # Private to its owner and staff until the owner publishes it; then its results, options and
    # per-pair predictions are public (that is what makes a leaderboard entry checkable).
    published = models.BooleanField(default=False, db_index=True)
    published_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["owner", "created_at"])]

    def __str__(self) -> str:
        return f"{self.display_name} ({self.get_kind_display()})"

    def get_absolute_url(self) -> str:
        return reverse("leaderboard:submission", args=[self.pk])

    def owner_shown_to(self, viewer=None) -> str:
        """The owner's name as `viewer` (None: the public) reads it: a staff member's username
        only to staff and to that member; to anyone else a submission staff made is owned by
        STAFF_OWNER, so no staff account name is public (sign-in throttles keep usernames)."""
        if not self.owner.is_staff or (viewer is not None and viewer.is_authenticated
                                       and (viewer.is_staff or viewer.pk == self.owner_id)):
            return self.owner.get_username()
        return STAFF_OWNER

    @property
    def model_shown(self) -> str:
        """`model_path` as people read it (pages, API, manifests): relative to MODELS_ROOT as
        stored, a served model's name, or for a local Hugging Face Hub snapshot (stored as its
        absolute folder in the server's cache) "hf:org/name@<revision>", never the server's path."""
        match = HUB_SNAPSHOT.search(self.model_path)
        if match and self.model_path.startswith("/"):
            return f"hf:{match['org']}/{match['name']}@{match['revision'][:12]}"
        return self.model_path

    @property
    def overall_status(self) -> str:
        """The least advanced run's status (a submission is done when all its runs are);
        reads `runs.all()`, so prefetch runs when listing many."""
        statuses = {run.status for run in self.runs.all()}
        return next((s for s in SUBMISSION_STATUS_ORDER if s in statuses), "PENDING")


class SubmissionAttempt(models.Model):
    """A submission attempt under way or refused: with the submissions made, what the hourly
    limit (SUBMISSIONS_PER_HOUR) counts, so refused attempts (too large, unreadable scores, a
    refused folder) cost the researcher as a submission does. Made, under the owner's row lock,
    before anything is read or checked; deleted when the attempt becomes a submission (then the
    submission counts); older than an hour, pruned at the owner's next attempt."""

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [models.Index(fields=["owner", "created_at"])]


# How a submission's runs sum up to one status: the first one any run has.
SUBMISSION_STATUS_ORDER = ("RUNNING", "QUEUED", "PENDING", "FAILED", "CANCELLED", "SUCCEEDED")


class EvaluationRun(Job):
    """One submission evaluated in one setting: the unit a GPU task works on. Units: one
    PairScore per benchmark item."""

    job_type = "evaluation"
    job_task = "gpu.leaderboard.evaluate_run"
    job_owner = "submission__owner"
    job_related = ("submission",)

    submission = models.ForeignKey(Submission, on_delete=models.CASCADE, related_name="runs")
    setting = models.CharField(max_length=16, choices=Setting.choices)
    # (weights hash, kind, benchmark) of the submission: with `setting`, what makes a result unique.
    fingerprint = models.CharField(max_length=64)
    metrics = models.JSONField(null=True, blank=True)

    class Meta:
        ordering = ["submission", "setting"]
        constraints = [
            models.UniqueConstraint(fields=["submission", "setting"], name="run_unique_setting"),
            # One live or successful result per (weights, kind, benchmark, setting); a failed or
            # cancelled run does not block submitting the same model again.
            models.UniqueConstraint(fields=["fingerprint", "setting"],
                                    condition=~Q(status__in=["FAILED", "CANCELLED"]),
                                    name="run_unique_result"),
        ]

    def __str__(self) -> str:
        return f"{self.submission.display_name} / {self.setting} ({self.status})"

    def job_title(self) -> str:
        return f"Evaluation of {self.submission.display_name} ({self.get_setting_display()})"

    def job_url(self) -> str:
        return self.submission.get_absolute_url()

    def job_retry_refusal(self) -> str:
        """Refused while another live or successful run holds this run's result; that run's
        submission is named only when it is published or this run's owner's (the reason goes to
        the owner, on the page and through /api/jobs/)."""
        clash = (EvaluationRun.objects.filter(fingerprint=self.fingerprint, setting=self.setting)
                 .exclude(pk=self.pk).exclude(status__in=[JobStatus.FAILED, JobStatus.CANCELLED])
                 .select_related("submission").first())
        if clash is None:
            return ""
        if not (clash.submission.published or clash.submission.owner_id == self.submission.owner_id):
            return "The same model was submitted again meanwhile by another researcher; that run carries the result."
        return (f"The same model was submitted again meanwhile (submission #{clash.submission_id}); "
                "that run carries the result.")


class PairScore(models.Model):
    """One pair's scores in one run; unique per (run, item), so a redelivered or retried
    task only scores what is still missing."""

    run = models.ForeignKey(EvaluationRun, on_delete=models.CASCADE, related_name="pair_scores")
    item = models.ForeignKey(BenchmarkItem, on_delete=models.PROTECT, related_name="+")
    chosen_score = models.FloatField(null=True)
    rejected_score = models.FloatField(null=True)
    correct = models.BooleanField()
    tie = models.BooleanField(default=False)
    details = models.JSONField(default=dict, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "item"], name="pairscore_unique_item")]


OutcomeKind = _choices("OutcomeKind", registry.OUTCOME_KINDS)


class DownstreamOutcome(models.Model):
    """What a reward model does for a policy: the judged rubric score of Best-of-N selections
    or of a policy trained against it, with the RM used in one setting. Computed here or
    imported from elsewhere.

    Identity of the RM: `submission` for our own runs; for an external model (no submission)
    the declared pair (`source`, `rm_name`), unique per source. `rm_name` of a submission's
    outcome is a copy of its display name, for reading only.

    Identity of the outcome: the RM, kind, policy, setting, domain and k, and `config_key`:
    sha256 of everything else that made it (the run's manifest without the environment: sample
    set knobs, policy model and endpoint, judge endpoint and model, PPO options, RM options;
    `leaderboard.services.outcomes.outcome_config_key`). Two runs differing in any of those keep
    two rows; rerunning one configuration updates its row. Imported rows have config_key "".
    `bon_run` / `ppo_run` name the run that recorded it (None for imported and synthetic rows).
    `synthetic`: made up (the demo's seed_demo), never measured; every page, export and API
    response showing the row says so."""

    rm_name = models.CharField(max_length=120, help_text="The reward model, as named on leaderboards.")
    submission = models.ForeignKey(Submission, null=True, blank=True, on_delete=models.CASCADE,
                                   related_name="outcomes")
    kind = models.CharField(max_length=12, choices=OutcomeKind.choices)
    policy = models.CharField(max_length=200, default="Qwen2.5-0.5B-Instruct")
    setting = models.CharField(max_length=16, choices=Setting.choices, default=Setting.PROFILE,
                               help_text="The setting the RM scored answers in.")
    domain = models.CharField(max_length=40, blank=True, help_text="Empty: all domains.")
    k = models.PositiveSmallIntegerField(null=True, blank=True, help_text="Best-of-k; empty for trained policies.")
    outcome = models.FloatField()
    ci_low = models.FloatField(null=True, blank=True)
    ci_high = models.FloatField(null=True, blank=True)
    n = models.PositiveIntegerField(default=0)
    source = models.CharField(max_length=200, default="prbench")
    config_key = models.CharField(max_length=64, blank=True, default="", help_text=(
        "sha256 of what made the outcome besides RM, kind, policy, setting, domain and k (judge, its model, "
        "sampling or PPO options); empty for imported rows."))
    bon_run = models.ForeignKey("BestOfNRun", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    ppo_run = models.ForeignKey("PPORun", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    synthetic = models.BooleanField(default=False, help_text="Made up for the demo (seed_demo), not measured.")
    manifest = models.JSONField(default=dict, blank=True, help_text=(
        "What reproduces this outcome (pipeline.manifest): the Best-of-N or PPO run's manifest for our own "
        "runs, the import's (file, its sha256, code version) for imported rows."))
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["kind", "policy", "setting", "rm_name", "k"]
        constraints = [
            # Partial indexes instead of NULLS NOT DISTINCT, which SQLite lacks.
            models.UniqueConstraint(fields=["submission", "kind", "policy", "setting", "domain", "k", "config_key"],
                                    condition=Q(submission__isnull=False, k__isnull=False),
                                    name="outcome_unique_submission_k_config"),
            models.UniqueConstraint(fields=["submission", "kind", "policy", "setting", "domain", "config_key"],
                                    condition=Q(submission__isnull=False, k__isnull=True),
                                    name="outcome_unique_submission_trained_config"),
            models.UniqueConstraint(fields=["source", "rm_name", "kind", "policy", "setting", "domain", "k",
                                            "config_key"],
                                    condition=Q(submission__isnull=True, k__isnull=False),
                                    name="outcome_unique_external_k_config"),
            models.UniqueConstraint(fields=["source", "rm_name", "kind", "policy", "setting", "domain", "config_key"],
                                    condition=Q(submission__isnull=True, k__isnull=True),
                                    name="outcome_unique_external_trained_config"),
        ]

    @property
    def run_ref(self) -> dict | None:
        """{"type": "best_of_n" | "ppo", "id"} of the run that recorded it, or None."""
        if self.bon_run_id:
            return {"type": "best_of_n", "id": self.bon_run_id}
        if self.ppo_run_id:
            return {"type": "ppo", "id": self.ppo_run_id}
        return None

    def __str__(self) -> str:
        return f"{self.rm_name} {self.kind}{'@' + str(self.k) if self.k else ''} ({self.setting}): {self.outcome:.3f}"


class ExternalBenchmarkScore(models.Model):
    """Accuracy of a reward model on another benchmark (e.g. RewardBench), to compare how
    well each benchmark predicts downstream outcomes. The RM is one of our submissions or an
    external model identified by (`source`, `rm_name`), as for DownstreamOutcome."""

    benchmark = models.CharField(max_length=120)
    rm_name = models.CharField(max_length=120)
    submission = models.ForeignKey(Submission, null=True, blank=True, on_delete=models.CASCADE,
                                   related_name="external_scores")
    setting = models.CharField(max_length=40, blank=True)
    # Reported figures of our own benchmark (the paper's table, issue 30): one domain of it ("" = all
    # pairs), and the RM type the source groups the model in ("" = not given).
    domain = models.CharField(max_length=40, blank=True, default="", help_text="Empty: all pairs.")
    rm_type = models.CharField(max_length=16, blank=True, default="",
                               help_text="scalar | generative | fine_tuned | other (prblib/rewards/presets.py).")
    accuracy = models.FloatField()
    source = models.CharField(max_length=200, blank=True)
    manifest = models.JSONField(default=dict, blank=True, help_text=(
        "What this figure traces to: the import (file, its sha256, code version) and, for our submissions, "
        "the weights hash."))
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["benchmark", "rm_name"]
        constraints = [
            models.UniqueConstraint(fields=["benchmark", "setting", "domain", "submission"],
                                    condition=Q(submission__isnull=False), name="external_unique_submission_domain"),
            models.UniqueConstraint(fields=["benchmark", "setting", "domain", "source", "rm_name"],
                                    condition=Q(submission__isnull=True), name="external_unique_rm_domain"),
        ]


class BestOfNRun(Job):
    """One reward model choosing among a sample set's answers; the judged outcome per k goes
    to DownstreamOutcome. Units: the RM's score of each sample and the judge's grade of each
    picked sample (BestOfNSample)."""

    job_type = "best_of_n"
    job_task = "gpu.leaderboard.best_of_n"
    job_owner = "submission__owner"
    job_related = ("submission", "sample_set__benchmark")

    submission = models.ForeignKey(Submission, on_delete=models.CASCADE, related_name="bon_runs")
    sample_set = models.ForeignKey("pipeline.PolicySampleSet", on_delete=models.PROTECT, related_name="+")
    setting = models.CharField(max_length=16, choices=Setting.choices, default=Setting.PROFILE)
    judge = models.ForeignKey(LLMEndpoint, on_delete=models.PROTECT, related_name="+")
    judge_model = models.CharField(max_length=300)
    protocol = models.CharField(max_length=16, default="prbench", help_text=(
        "The rules of the RM's input and the rubric judge (BestOfNOptions.protocol; docs/protocols.md)."))
    results = models.JSONField(null=True, blank=True)

    class Meta:
        verbose_name = "Best-of-N run"
        constraints = [models.UniqueConstraint(fields=["submission", "sample_set", "setting", "judge", "judge_model",
                                                       "protocol"], name="bon_unique_protocol")]

    def __str__(self) -> str:
        return f"Best-of-N of {self.submission.display_name} on {self.sample_set}"

    def job_url(self) -> str:
        return self.submission.get_absolute_url()


class BestOfNSample(models.Model):
    """One policy sample in one Best-of-N run: the RM's score, then (only for samples some k
    or the random baseline picked) the judge's grade. Unique per (run, item, index), so a
    redelivered run scores and judges only what is missing."""

    run = models.ForeignKey(BestOfNRun, on_delete=models.CASCADE, related_name="units")
    item = models.ForeignKey(BenchmarkItem, on_delete=models.PROTECT, related_name="+")
    index = models.PositiveSmallIntegerField()
    rm_score = models.FloatField()
    judged = models.BooleanField(default=False)
    judge_score = models.FloatField(null=True, blank=True, help_text="Mean aspect grade 0-2; empty: unreadable.")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "item", "index"], name="bonsample_unique_index")]


class PPORun(Job):
    """A policy trained with PPO against one submitted RM, then judged on held-out questions.
    Units: the training (its result stored in `results["training"]`), then one PPOAnswer per
    held-out question."""

    job_type = "ppo"
    job_task = "gpu.leaderboard.ppo"
    job_owner = "submission__owner"
    job_related = ("submission",)

    submission = models.ForeignKey(Submission, on_delete=models.CASCADE, related_name="ppo_runs")
    policy = models.CharField(max_length=200, default="Qwen2.5-0.5B-Instruct", help_text="Name shown in results.")
    policy_model = models.CharField(max_length=300, help_text="Causal-LM folder under MODELS_ROOT.")
    setting = models.CharField(max_length=16, choices=Setting.choices, default=Setting.PROFILE)
    judge = models.ForeignKey(LLMEndpoint, on_delete=models.PROTECT, related_name="+")
    judge_model = models.CharField(max_length=300)
    steps = models.PositiveIntegerField(default=64)
    batch_size = models.PositiveIntegerField(default=8)
    response_length = models.PositiveIntegerField(default=256)
    seed = models.IntegerField(default=0)
    eval_fraction = models.FloatField(default=0.2, help_text="Share of the benchmark's questions held out to judge.")
    options = models.JSONField(default=dict, blank=True,
                               help_text="The other PPO knobs (prblib.rewards.options.PPOOptions): learning rate, KL "
                                         "coefficient, epochs, mini-batches, ...; missing ones take their default.")
    results = models.JSONField(null=True, blank=True)

    class Meta:
        verbose_name = "PPO run"

    def __str__(self) -> str:
        return f"PPO of {self.policy} against {self.submission.display_name}"

    def job_url(self) -> str:
        return self.submission.get_absolute_url()


class PPOAnswer(models.Model):
    """The trained policy's answer to one held-out question and the judge's grade of it;
    unique per (run, item), so a redelivered run answers and judges only what is missing."""

    run = models.ForeignKey(PPORun, on_delete=models.CASCADE, related_name="answers")
    item = models.ForeignKey(BenchmarkItem, on_delete=models.PROTECT, related_name="+")
    answer = models.TextField()
    truncated = models.BooleanField(default=False, help_text=(
        "The answer stopped at the token cap even after one retry with twice the budget; it is graded as cut "
        "and counted in the run's results (answers.truncated)."))
    judged = models.BooleanField(default=False)
    judge_score = models.FloatField(null=True, blank=True, help_text="Mean aspect grade 0-2; empty: unreadable.")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "item"], name="ppoanswer_unique_item")]
