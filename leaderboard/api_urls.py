from django.urls import path
from rest_framework.routers import SimpleRouter

from . import api, health_api

router = SimpleRouter()
router.register("submissions", api.SubmissionViewSet, basename="submission")

urlpatterns = router.urls + [
    path("leaderboard/", api.LeaderboardView.as_view(), name="api-leaderboard"),
    path("correlations/", api.CorrelationsView.as_view(), name="api-correlations"),
    path("benchmarks/<str:name>/health/", health_api.BenchmarkHealthView.as_view(), name="api-benchmark-health"),
    path("benchmarks/<str:name>/health/campaigns/", health_api.HealthCampaignView.as_view(),
         name="api-benchmark-health-campaigns"),
    path("benchmarks/<str:name>/health/versions/", health_api.HealthVersionView.as_view(),
         name="api-benchmark-health-versions"),
]
