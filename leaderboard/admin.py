from django import forms
from django.contrib import admin
from django.utils.html import format_html_join

from jobs.admin import LIFECYCLE_FIELDS, enqueue_action

from prblib.rewards.options import OptionsError, parse_run_options

from .models import BestOfNRun, DownstreamOutcome, PPORun, EvaluationRun, ExternalBenchmarkScore, PairScore, Submission
from .services import bon_options, ppo_options
from .services.outcomes import PPO_COLUMNS


class RunInline(admin.TabularInline):
    model = EvaluationRun
    extra = 0
    fields = ("setting", "status", "progress_done", "progress_total", "attempts", "heartbeat_at", "error")
    readonly_fields = fields
    can_delete = False
    show_change_link = True


@admin.register(Submission)
class SubmissionAdmin(admin.ModelAdmin):
    list_display = ("display_name", "kind", "benchmark", "owner", "published", "created_at")
    list_filter = ("kind", "benchmark", "published")
    search_fields = ("display_name", "model_path", "weights_hash", "owner__username")
    list_select_related = ("benchmark", "owner")
    # The scores file is checked and fingerprinted when it is submitted (weights_hash is its
    # content's digest); replacing it here would skip both.
    readonly_fields = ("weights_hash", "scores_file", "created_at")
    inlines = [RunInline]


@admin.register(EvaluationRun)
class EvaluationRunAdmin(admin.ModelAdmin):
    list_display = ("submission", "setting", "status", "progress_done", "progress_total", "attempts", "heartbeat_at")
    list_filter = ("status", "setting")
    list_select_related = ("submission",)
    readonly_fields = ("fingerprint", "metrics") + LIFECYCLE_FIELDS


@admin.register(PairScore)
class PairScoreAdmin(admin.ModelAdmin):
    list_display = ("run", "item", "chosen_score", "rejected_score", "correct", "tie")
    list_filter = ("correct", "tie")
    list_select_related = ("run__submission", "item__benchmark")
    readonly_fields = ("run", "item", "chosen_score", "rejected_score", "correct", "tie", "details")

    def has_add_permission(self, request):
        return False


@admin.register(DownstreamOutcome)
class DownstreamOutcomeAdmin(admin.ModelAdmin):
    list_display = ("rm_name", "submission", "kind", "policy", "setting", "domain", "k", "outcome", "n", "source")
    list_filter = ("kind", "policy", "setting", "source")
    list_select_related = ("submission",)
    search_fields = ("rm_name",)


@admin.register(ExternalBenchmarkScore)
class ExternalBenchmarkScoreAdmin(admin.ModelAdmin):
    list_display = ("benchmark", "rm_name", "submission", "setting", "accuracy", "source")
    list_filter = ("benchmark",)


def _knobs_table(options: dict):
    return format_html_join("\n", "<div><code>{}</code> = {}</div>", sorted(options.items()))


@admin.register(BestOfNRun)
class BestOfNRunAdmin(admin.ModelAdmin):
    list_display = ("submission", "sample_set", "setting", "judge_model", "status")
    list_filter = ("status",)
    readonly_fields = ("sampling_options", "results") + LIFECYCLE_FIELDS

    @admin.display(description="Sampling knobs (of the sample set)")
    def sampling_options(self, run):
        return _knobs_table(bon_options(run.sample_set)) if run.sample_set_id else "-"

    actions = ("run_on_worker",)
    run_on_worker = enqueue_action("Run on a GPU worker (samples must exist)")


class PPORunForm(forms.ModelForm):
    """Checks the knobs as run_ppo does (PPOOptions): one error naming the key."""

    class Meta:
        model = PPORun
        fields = "__all__"

    def clean(self):
        data = super().clean()
        try:
            parse_run_options("ppo", data.get("options"),
                              columns={k: data[k] for k in PPO_COLUMNS if data.get(k) is not None})
        except OptionsError as exc:
            field = exc.key if exc.key in PPO_COLUMNS else "options"
            raise forms.ValidationError({field: str(exc)}) from None
        return data


@admin.register(PPORun)
class PPORunAdmin(admin.ModelAdmin):
    form = PPORunForm
    list_display = ("submission", "policy", "steps", "judge_model", "status")
    list_filter = ("status",)
    readonly_fields = ("knobs", "results") + LIFECYCLE_FIELDS

    @admin.display(description="All PPO knobs (with defaults)")
    def knobs(self, run):
        if not run.pk:
            return "-"
        try:
            return _knobs_table(ppo_options(run).model_dump())
        except OptionsError as exc:  # stored before the form checked them: say so, keep the page
            return str(exc)
    actions = ("run_on_worker",)
    run_on_worker = enqueue_action("Train and judge on a GPU worker")
