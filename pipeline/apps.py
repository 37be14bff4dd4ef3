from django.apps import AppConfig


class PipelineConfig(AppConfig):
    name = "pipeline"
    verbose_name = "Benchmark data and pipeline"
