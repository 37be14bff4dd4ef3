from django.contrib import admin

from jobs.admin import LIFECYCLE_FIELDS, enqueue_action

from .models import BestOfNRun, DownstreamOutcome, PPORun, EvaluationRun, ExternalBenchmarkScore, PairScore, Submission


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
    readonly_fields = ("weights_hash", "created_at")
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


@admin.register(BestOfNRun)
class BestOfNRunAdmin(admin.ModelAdmin):
    list_display = ("submission", "sample_set", "setting", "judge_model", "status")
    list_filter = ("status",)
    readonly_fields = ("results",) + LIFECYCLE_FIELDS
    actions = ("run_on_worker",)
    run_on_worker = enqueue_action("Run on a GPU worker (samples must exist)")


@admin.register(PPORun)
class PPORunAdmin(admin.ModelAdmin):
    list_display = ("submission", "policy", "steps", "judge_model", "status")
    list_filter = ("status",)
    readonly_fields = ("results",) + LIFECYCLE_FIELDS
    actions = ("run_on_worker",)
    run_on_worker = enqueue_action("Train and judge on a GPU worker")
