from django.apps import AppConfig


class PrbenchConfig(AppConfig):
    name = "prbench"
    verbose_name = "prbench"
