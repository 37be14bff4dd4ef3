from django.apps import AppConfig


class PipelineConfig(AppConfig):
    name = "pipeline"
    verbose_name = "Benchmark data and pipeline"

    def ready(self):
        from django.conf import settings

        from prblib import modelcheck

        # Model-folder checks bounded by the settings in force at each call (tests override them).
        modelcheck.limits_from = lambda: modelcheck.FolderLimits(max_entries=settings.MODEL_MAX_FILES,
                                                                 max_seconds=settings.MODEL_CHECK_SECONDS)
