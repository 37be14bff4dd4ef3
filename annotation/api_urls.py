from django.urls import path

from . import api

urlpatterns = [
    path("annotation/campaigns/", api.CampaignsView.as_view(), name="api-campaigns"),
    path("annotation/campaigns/<int:pk>/report/", api.ReportView.as_view(), name="api-campaign-report"),
    path("annotation/campaigns/<int:pk>/ratings/", api.RatingsExportView.as_view(), name="api-campaign-ratings"),
    path("annotation/next/", api.NextView.as_view(), name="api-annotation-next"),
    path("annotation/ratings/", api.RatingsView.as_view(), name="api-annotation-ratings"),
    path("annotation/skip/", api.SkipView.as_view(), name="api-annotation-skip"),
    path("annotation/skip/undo/", api.SkipUndoView.as_view(), name="api-annotation-skip-undo"),
    path("annotation/drafts/<str:token>/", api.DraftView.as_view(), name="api-annotation-draft"),
    path("annotation/campaigns/<int:pk>/skips/", api.SkipsExportView.as_view(), name="api-campaign-skips"),
]
