from django.urls import path, re_path

from . import views

app_name = "annotation"
urlpatterns = [
    path("annotate/", views.campaign_list, name="annotate"),
    path("annotate/<int:pk>/", views.annotate, name="annotate-campaign"),
    path("annotate/<int:pk>/history/", views.history, name="history"),
    path("annotate/<int:pk>/history/<str:token>/", views.revise, name="revise"),
    path("annotate/<int:pk>/skipped/<str:token>/undo/", views.unskip, name="unskip"),
    path("annotation/campaigns/", views.dashboard, name="campaigns"),
    path("annotation/campaigns/new/", views.campaign_new, name="campaign-new"),
    path("annotation/campaigns/<int:pk>/report/", views.report, name="report"),
    path("annotation/campaigns/<int:pk>/pairs/<str:pair_id>/", views.pair_detail, name="pair"),
    path("annotation/campaigns/<int:pk>/guidelines/", views.guidelines_edit, name="guidelines"),
    path("annotation/campaigns/<int:pk>/annotators/", views.campaign_assignees, name="assignees"),
    path("annotation/campaigns/<int:pk>/validate/", views.record_validation, name="record-validation"),
    path("annotation/campaigns/<int:pk>/close/", views.set_open, {"is_open": False}, name="close"),
    path("annotation/campaigns/<int:pk>/reopen/", views.set_open, {"is_open": True}, name="reopen"),
    # The former toggle URL: it now needs an explicit action=close|reopen (never flips the state).
    path("annotation/campaigns/<int:pk>/toggle/", views.set_open, name="toggle-open"),
    re_path(r"^annotation/campaigns/(?P<pk>\d+)/ratings\.(?P<fmt>csv|jsonl)$", views.export, name="export"),
    re_path(r"^annotation/campaigns/(?P<pk>\d+)/skips\.(?P<fmt>csv|jsonl)$", views.export_skips,
            name="export-skips"),
]
