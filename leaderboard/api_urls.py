from django.urls import path
from rest_framework.routers import SimpleRouter

from . import api

router = SimpleRouter()
router.register("submissions", api.SubmissionViewSet, basename="submission")

urlpatterns = router.urls + [
    path("leaderboard/", api.LeaderboardView.as_view(), name="api-leaderboard"),
    path("correlations/", api.CorrelationsView.as_view(), name="api-correlations"),
]
