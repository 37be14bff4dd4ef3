from django.contrib import admin, messages

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
    readonly_fields = ("fingerprint", "metrics", "log_tail", "heartbeat_at", "worker", "queued_at", "started_at",
                       "finished_at")


@admin.register(PairScore)
class PairScoreAdmin(admin.ModelAdmin):
    list_display = ("run", "item", "chosen_score", "rejected_score", "correct", "tie")
    list_filter = ("correct", "tie")
    list_select_related = ("run__submission", "item__benchmark")
    readonly_fields = ("run", "item", "chosen_score", "rejected_score", "correct", "tie", "details")

    def has_add_permission(self, request):
        return False


def queue_on_worker(model_admin, request, queryset, task, what: str) -> None:
    """Send one task per selected row once the transaction commits (the task re-checks the status)."""
    for pk in queryset.values_list("pk", flat=True):
        task.delay_on_commit(pk)
    model_admin.message_user(request, f"Queued {queryset.count()} {what}.", messages.SUCCESS)


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
    readonly_fields = ("status", "results", "error")
    actions = ("run_on_worker",)

    @admin.action(description="Run on a GPU worker (samples must exist)")
    def run_on_worker(self, request, queryset):
        from .tasks import best_of_n

        queue_on_worker(self, request, queryset, best_of_n, "Best-of-N run(s)")


@admin.register(PPORun)
class PPORunAdmin(admin.ModelAdmin):
    list_display = ("submission", "policy", "steps", "judge_model", "status")
    list_filter = ("status",)
    readonly_fields = ("status", "results", "error")
    actions = ("run_on_worker",)

    @admin.action(description="Train and judge on a GPU worker")
    def run_on_worker(self, request, queryset):
        from .tasks import ppo

        queue_on_worker(self, request, queryset, ppo, "PPO run(s)")
