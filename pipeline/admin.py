from django import forms
from django.contrib import admin, messages

from jobs.admin import LIFECYCLE_FIELDS, enqueue_action

from .models import Benchmark, BenchmarkItem, BuildRun, LLMEndpoint, PolicySampleSet, PromptTemplate
from .services import benchmark_freeze, benchmark_stats_enqueue


@admin.register(Benchmark)
class BenchmarkAdmin(admin.ModelAdmin):
    list_display = ("name", "item_count", "source", "short_hash", "is_synthetic", "frozen_at", "created_at")
    list_filter = ("source", "frozen_at")
    search_fields = ("name", "description", "content_hash")
    readonly_fields = ("content_hash", "item_count", "stats", "stats_computed_at", "frozen_at", "created_by",
                       "created_at")
    actions = ("recompute_stats", "freeze")

    @admin.display(description="sha256")
    def short_hash(self, obj):
        return obj.content_hash[:12]

    @admin.display(boolean=True, description="synthetic")
    def is_synthetic(self, obj):
        return obj.is_synthetic

    def has_add_permission(self, request):
        return False  # benchmarks come from import_benchmark or the pipeline, with a content hash

    def has_delete_permission(self, request, obj=None):
        return super().has_delete_permission(request, obj) and (obj is None or not obj.is_frozen)

    def get_readonly_fields(self, request, obj=None):
        if obj is not None and obj.is_frozen:
            return [f.name for f in self.model._meta.fields]
        return self.readonly_fields

    @admin.action(description="Recompute statistics (on a worker)")
    def recompute_stats(self, request, queryset):
        benchmark_stats_enqueue(benchmark_ids=list(queryset.values_list("pk", flat=True)))
        self.message_user(request, f"Queued statistics for {queryset.count()} benchmark(s).", messages.SUCCESS)

    @admin.action(description="Freeze (items can no longer change)")
    def freeze(self, request, queryset):
        frozen = sum(benchmark_freeze(benchmark=b) for b in queryset)
        self.message_user(request, f"Froze {frozen} benchmark(s).", messages.SUCCESS)


@admin.register(BenchmarkItem)
class BenchmarkItemAdmin(admin.ModelAdmin):
    list_display = ("source_id", "benchmark", "domain", "short_question")
    list_filter = ("benchmark", "domain")
    search_fields = ("source_id", "question")
    list_select_related = ("benchmark",)
    readonly_fields = [f.name for f in BenchmarkItem._meta.fields]

    @admin.display(description="question")
    def short_question(self, obj):
        return obj.question[:80]

    # Items are view-only: they are covered by the benchmark's content hash, so a change
    # means importing a new benchmark version rather than editing rows in place.
    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(LLMEndpoint)
class LLMEndpointAdmin(admin.ModelAdmin):
    list_display = ("name", "base_url", "api_key_env", "max_concurrency", "enabled")
    list_filter = ("enabled",)


class PromptTemplateForm(forms.ModelForm):
    class Meta:
        model = PromptTemplate
        fields = ("name", "purpose", "system", "user")

    def clean(self):
        from .build import BuildError, _as_ml_template

        data = super().clean()
        name = data.get("name") or getattr(self.instance, "name", "")
        purpose = data.get("purpose") or getattr(self.instance, "purpose", "")
        try:
            _as_ml_template(PromptTemplate(name=name, purpose=purpose, version=1, system=data.get("system", ""),
                                           user=data.get("user", "")))
        except BuildError as exc:
            raise forms.ValidationError(str(exc)) from None
        return data


@admin.register(PromptTemplate)
class PromptTemplateAdmin(admin.ModelAdmin):
    form = PromptTemplateForm
    list_display = ("name", "purpose", "version", "created_at", "created_by")
    list_filter = ("purpose", "name")
    readonly_fields = ("version", "created_by", "created_at")

    def get_readonly_fields(self, request, obj=None):
        return self.readonly_fields + (("name", "purpose") if obj else ())

    def save_model(self, request, obj, form, change):
        """An edit never overwrites a version that items may point at: it writes the next one."""
        from .build import template_save_version

        saved = template_save_version(name=obj.name, purpose=obj.purpose, system=obj.system, user=obj.user,
                                      created_by=request.user)
        obj.pk, obj.version, obj._state.adding = saved.pk, saved.version, False
        if change:
            messages.info(request, f"Saved as {saved} (earlier versions are kept).")


@admin.register(BuildRun)
class BuildRunAdmin(admin.ModelAdmin):
    list_display = ("name", "status", "counts", "benchmark", "created_at")
    list_filter = ("status",)
    readonly_fields = ("counts", "tokens", "benchmark", "created_by") + LIFECYCLE_FIELDS


class PolicySampleSetForm(forms.ModelForm):
    """Checks the sampling knobs as run_best_of_n does (BestOfNOptions): one error naming the field."""

    FIELDS = {"n": "n", "temperature": "temperature", "top_p": "top_p", "max_new_tokens": "max_tokens",
              "seed": "seed"}

    class Meta:
        model = PolicySampleSet
        fields = "__all__"

    def clean(self):
        from prblib.rewards.options import OptionsError, parse_run_options

        data = super().clean()
        try:
            parse_run_options("best_of_n", {k: data.get(f) for k, f in self.FIELDS.items() if f in data})
        except OptionsError as exc:
            raise forms.ValidationError({self.FIELDS.get(exc.key, None): str(exc)}) from None
        return data


@admin.register(PolicySampleSet)
class PolicySampleSetAdmin(admin.ModelAdmin):
    form = PolicySampleSetForm
    list_display = ("policy", "benchmark", "model", "n", "status")
    list_filter = ("status", "benchmark")
    readonly_fields = ("failed_items", "usage") + LIFECYCLE_FIELDS
    actions = ("sample_on_worker",)
    sample_on_worker = enqueue_action("Sample (or resume) on a GPU worker")
