import secrets
from pathlib import Path

from django.conf import settings
from django.contrib.auth.models import Group, User
from django.core.management.base import BaseCommand, CommandError

from pipeline.formats import FormatError
from pipeline.services import BenchmarkError, benchmark_import
from core.roles import ANNOTATOR, RESEARCHER, ROLE_GROUPS

SAMPLE_PATH = Path(settings.BASE_DIR) / "pipeline" / "sample_data"
SAMPLE_NAME = "prb-sample"
SYNTHETIC_SOURCE = "synthetic demo (seed_demo)"
FAILED_DEMO_NAME = "Demo RM, max length 64 (fails)"
FLIPPED_OVERLAP_SHARES = (15, 30, 45)  # percent of pairs whose overlap scores are swapped
DEMO_ACCOUNTS = (
    ("admin", {"is_staff": True, "is_superuser": True}, ()),
    ("researcher", {}, (RESEARCHER,)),
    ("annotator", {}, (ANNOTATOR,)),
)


SYNTHETIC_CONFIG_KEY = "synthetic"  # DownstreamOutcome.config_key of made-up rows: never a measured run's


def demo_reference_names() -> set[str]:
    """The display names of the references seed_demo makes: the model-free baselines and the
    flipped-overlap references."""
    from prblib.rewards.baselines import BASELINES

    return ({f"Baseline: {name.replace('_', ' ')}" for name in BASELINES}
            | {f"Demo: overlap, {share}% flipped" for share in FLIPPED_OVERLAP_SHARES})


def demo_references(benchmark):
    """The submissions seed_demo made as references on `benchmark`: uploaded scores
    (kind "scores"), owned by a demo account, named as seed_demo names them. A researcher's own
    model (another kind, another name or another owner) is never one."""
    from leaderboard.models import Submission

    return list(Submission.objects.filter(benchmark=benchmark, kind="scores", display_name__in=demo_reference_names(),
                                          owner__username__in=[name for name, _, _ in DEMO_ACCOUNTS]))


def synthetic_offset(name: str) -> float:
    """A made-up, fixed per-model shift of the demo's synthetic outcomes, in [-0.08, 0.08]
    (steps of 0.001), from the CRC-32 of the model's display name: large enough that the
    demo's outcome ranking is not a copy of its accuracy ranking."""
    import zlib

    return (zlib.crc32(name.encode()) % 161 - 80) / 1000


DEMO_GUIDELINES = """# How to rate

You see one person's question, their most relevant past posts and the **personal rubric**:
what this person needs from an answer. Rate each of the two responses on its own, 1 to 5:

- **Factuality**: is it accurate?
- **Relevance**: does it answer the question asked?
- **Helpfulness**: would it help someone asking this?
- **Personal Rubrics**: does it meet *this person's* rubric aspects?

Keys: 1-5 rate the highlighted field and move on, Enter submits, S skips, ? shows these guidelines.
"""


class Command(BaseCommand):
    help = ("Load the synthetic sample benchmark and, in DEBUG only, the demo accounts (a password is printed "
            "when an account is created and kept on later runs; --reset-passwords sets and prints new ones).")

    def add_arguments(self, parser):
        parser.add_argument("--reset-passwords", action="store_true",
                            help="Give every demo account a new password and print it (this signs them out).")

    def handle(self, *args, **options):
        for name in ROLE_GROUPS:
            Group.objects.get_or_create(name=name)
        try:
            result = benchmark_import(path=SAMPLE_PATH, name=SAMPLE_NAME)
        except (FormatError, BenchmarkError) as exc:
            raise CommandError(f"sample benchmark: {exc}") from None
        state = "loaded" if result.created else "already loaded"
        self.stdout.write(f"sample benchmark '{SAMPLE_NAME}': {result.item_count} items ({state})")

        if not settings.DEBUG:
            self.stdout.write("DEBUG is off: no demo accounts created (use createsuperuser).")
            return
        self.stdout.write("demo accounts:")
        for username, flags, groups in DEMO_ACCOUNTS:
            user, created = User.objects.get_or_create(username=username,
                                                       defaults={"email": f"{username}@demo.invalid"})
            for flag, value in flags.items():
                setattr(user, flag, value)
            # A password is set (and printed, once) for a new account or on request; otherwise it
            # stays, so a second `make demo` neither changes passwords nor signs anyone out.
            password = None
            if created or options.get("reset_passwords") or not user.has_usable_password():
                password = secrets.token_urlsafe(9)
                user.set_password(password)
            user.save()
            user.groups.set(Group.objects.filter(name__in=groups))
            self.stdout.write(f"  {username:<11} {password}" if password else
                              f"  {username:<11} (password unchanged: `manage.py seed_demo --reset-passwords` "
                              "prints new ones)")
        researcher, staff = User.objects.get(username="researcher"), User.objects.get(username="admin")
        self._baseline_evaluations(result.benchmark, researcher)
        self._flipped_references(result.benchmark, staff)
        self._campaign(result.benchmark, staff)
        self._demo_model()
        self._failed_submission(result.benchmark, researcher)
        self._synthetic_outcomes(result.benchmark)
        self._health(result.benchmark)

    def _demo_model(self) -> None:
        """A tiny scalar RM with random weights under MODELS_ROOT, so there is a model to submit."""
        from prblib.rewards.demo_model import DEMO_MODEL_DIR, build_random_scalar_rm

        folder = Path(settings.MODELS_ROOT) / DEMO_MODEL_DIR
        state = "already there"
        if not (folder / "model.safetensors").is_file():
            build_random_scalar_rm(folder)
            state = "built"
        self.stdout.write(f"demo model (RANDOM weights, chance-level scores) {state}: {folder}\n"
                          f"  submit it at /submit/ as researcher: kind 'Scalar', model folder '{DEMO_MODEL_DIR}'")

    def _failed_submission(self, benchmark, owner) -> None:
        """A submission of the demo RM that really fails on a worker's code path, so a researcher
        sees what a failed run looks like: max length 64 tokens, which no sample pair fits (the
        run stops at the first pair with that reason). Made once: a later seed_demo keeps it."""
        from leaderboard import services as lb
        from leaderboard.models import Submission
        from prblib.rewards.demo_model import DEMO_MODEL_DIR

        submission = Submission.objects.filter(owner=owner, display_name=FAILED_DEMO_NAME).first()
        if submission is None:
            try:
                submission = lb.submission_create(user=owner, request=lb.SubmissionRequest(
                    display_name=FAILED_DEMO_NAME, benchmark=benchmark.name, kind="scalar", settings=("no_profile",),
                    model_path=DEMO_MODEL_DIR, max_length=64))
            except lb.SubmissionRefused as exc:  # e.g. the demo RM already ran in this setting
                self.stdout.write(f"failed demo submission: not made ({exc})")
                return
            for run in submission.runs.all():
                lb.run_execute(run_id=run.pk)  # in-process, like the baselines
        run = submission.runs.get()
        self.stdout.write(f"failed demo submission '{FAILED_DEMO_NAME}': {run.status} "
                          f"(/submissions/{submission.pk}/; all failed ones: /submissions/?status=FAILED)")

    def _flipped_references(self, benchmark, owner) -> None:
        """Three published references made from the word-overlap baseline with a seeded share of
        its pairs' scores swapped ("Demo: overlap, N% flipped"), so the correlations dashboard
        has the five RMs its confidence intervals need (prblib.stats.correlation.MIN_RMS_FOR_CI),
        spread along the accuracy axis so their chart labels do not sit on each other. Owned by
        the staff account, whose submissions are not rate-limited, so the researcher keeps their
        hourly allowance for their own."""
        import random

        from prblib.rewards.baselines import BASELINES
        from pipeline.services import item_pair_input

        pairs = [item_pair_input(item) for item in benchmark.items.order_by("position")]
        scores = list(BASELINES["profile_overlap"](pairs))
        for share in FLIPPED_OVERLAP_SHARES:
            rng = random.Random(share)
            rows = [(i, r, c) if rng.random() < share / 100 else (i, c, r) for i, c, r in scores]
            self._finished_scores(benchmark, owner, f"Demo: overlap, {share}% flipped", f"overlap-flipped-{share}", rows)

    def _synthetic_outcomes(self, benchmark) -> None:
        """Made-up Best-of-N and PPO outcomes for the demo's references only (`demo_references`:
        the uploaded-scores baselines and flipped references this command makes), stored with
        synthetic=True and the source SYNTHETIC_SOURCE so the correlations dashboard has
        something to draw and every page, export and API response says they are made up. Never
        for another model, however it is named or whoever owns it (a researcher's own published
        model gets none, on any run of this command; made-up rows of such a model left by an
        earlier version are deleted). Formula (no measurement behind it): Best-of-k outcome =
        0.8 + 0.6 * (accuracy - 0.5) * log2(k) / 4 + e on the judge's 0-2 rubric scale, PPO =
        0.8 + 0.8 * (accuracy - 0.5) + e, where e = synthetic_offset(display name) in
        [-0.08, 0.08] is fixed per model (so rankings are not all perfect); CIs ±0.05."""
        import math

        from leaderboard.models import DownstreamOutcome, OutcomeKind
        from leaderboard.selectors import succeeded_runs
        from leaderboard.services import outcome_store
        from prblib.registry import KS

        references = demo_references(benchmark)
        removed, _ = (DownstreamOutcome.objects.filter(source=SYNTHETIC_SOURCE)
                      .exclude(submission_id__in=[s.pk for s in references]).delete())
        count = 0
        for run in succeeded_runs(benchmark=benchmark.name, setting="profile").filter(
                submission__in=references):
            accuracy = (run.metrics or {}).get("accuracy")
            if accuracy is None:
                continue
            e = synthetic_offset(run.submission.display_name)
            rows = [(OutcomeKind.BEST_OF_N, k, 0.8 + 0.6 * (accuracy - 0.5) * math.log2(k) / 4 + e)
                    for k in KS] + [(OutcomeKind.PPO, None, 0.8 + 0.8 * (accuracy - 0.5) + e)]
            for kind, k, value in rows:
                outcome_store(submission=run.submission, rm_name=run.submission.display_name, source=SYNTHETIC_SOURCE,
                              kind=kind, policy="Qwen2.5-0.5B-Instruct", setting="profile", domain="", k=k,
                              outcome=value, ci_low=value - 0.05, ci_high=value + 0.05, n=benchmark.item_count,
                              config_key=SYNTHETIC_CONFIG_KEY, synthetic=True,
                              manifest={"synthetic": True, "formula": "seed_demo._synthetic_outcomes"})
                count += 1
        self.stdout.write(f"synthetic downstream outcomes (made up, labelled '{SYNTHETIC_SOURCE}'): {count} rows"
                          f" for {len(references)} demo references"
                          + (f"; {removed} made-up rows of other models removed" if removed else ""))

    def _health(self, benchmark) -> None:
        """Where the sample's health page is and what it flags (from the references above)."""
        from leaderboard.services.health import benchmark_health

        summary = benchmark_health(benchmark=benchmark)["summary"]
        self.stdout.write(f"benchmark health: /benchmarks/{benchmark.name}/health/ ({summary['flagged']} of "
                          f"{summary['pairs']} pairs flagged; as admin, 'Re-annotate the flagged pairs' opens a "
                          "campaign on them)")

    def _campaign(self, benchmark, staff) -> None:
        from annotation.models import Campaign
        from annotation.services.campaigns import campaign_create
        from annotation.services.demo import campaign_seed_demo_ratings

        # The demo's own campaign (by its name and creator), never one a user opened on the sample.
        campaign = Campaign.objects.filter(benchmark=benchmark, name="Sample validation", created_by=staff).first()
        if campaign is None:
            campaign = campaign_create(user=staff, benchmark=benchmark.name, name="Sample validation",
                                       guidelines=DEMO_GUIDELINES, overlap=3)
        campaign_seed_demo_ratings(campaign=campaign)
        self.stdout.write(f"annotation campaign '{campaign.name}': /annotate/{campaign.pk}/ "
                          f"(report: /annotation/campaigns/{campaign.pk}/report/)")

    def _baseline_evaluations(self, benchmark, owner) -> None:
        """Finished evaluations of the model-free baselines, so the leaderboard has rows to show."""
        from prblib.rewards.baselines import BASELINES
        from pipeline.services import item_pair_input

        pairs = [item_pair_input(item) for item in benchmark.items.order_by("position")]
        for name, scorer in BASELINES.items():
            self._finished_scores(benchmark, owner, f"Baseline: {name.replace('_', ' ')}", name, scorer(pairs))

    def _finished_scores(self, benchmark, owner, display_name: str, file_stem: str, rows) -> None:
        """Submit (id, chosen_score, rejected_score) rows as an uploaded-scores submission in the
        profile setting, score it in-process and publish it; say so when it already exists."""
        import json

        from django.core.files.uploadedfile import SimpleUploadedFile

        from leaderboard import services as lb

        body = "".join(json.dumps({"id": i, "chosen_score": c, "rejected_score": r}) + "\n" for i, c, r in rows)
        try:
            submission = lb.submission_create(user=owner, request=lb.SubmissionRequest(
                display_name=display_name, benchmark=benchmark.name, kind="scores",
                settings=("profile",), scores_file=SimpleUploadedFile(f"{file_stem}.jsonl", body.encode()),
                license="n/a"))
        except lb.SubmissionRefused:
            self.stdout.write(f"'{display_name}': already evaluated")
            return
        for run in submission.runs.all():
            lb.run_execute(run_id=run.pk)  # in-process: the demo needs no worker for this
        lb.submission_publish(user=owner, submission=submission)  # public references
        run = submission.runs.get()
        run.refresh_from_db()
        self.stdout.write(f"'{display_name}': {run.status}, accuracy {run.metrics['accuracy']:.3f}")
