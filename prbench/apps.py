from django.apps import AppConfig


class PrbenchConfig(AppConfig):
    name = "prbench"
    verbose_name = "prbench"

    def ready(self):
        from core import throttles  # noqa: F401 (connects the failed-login counter)
