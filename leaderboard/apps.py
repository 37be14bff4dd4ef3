from django.apps import AppConfig


class LeaderboardConfig(AppConfig):
    name = "leaderboard"

    def ready(self):
        from jobs.services import job_retry_requested

        from .services.submissions import count_job_retry

        # Retries of researchers' jobs count toward the hourly submission limit.
        job_retry_requested.connect(count_job_retry, dispatch_uid="leaderboard.count_job_retry")
