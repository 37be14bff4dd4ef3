from django.urls import path, re_path

from . import views

app_name = "annotation"
urlpatterns = [
    path("annotate/", views.campaign_list, name="annotate"),
    path("annotate/<int:pk>/", views.annotate, name="annotate-campaign"),
    path("annotation/campaigns/new/", views.campaign_new, name="campaign-new"),
    path("annotation/campaigns/<int:pk>/report/", views.report, name="report"),
    path("annotation/campaigns/<int:pk>/validate/", views.record_validation, name="record-validation"),
    path("annotation/campaigns/<int:pk>/toggle/", views.toggle_open, name="toggle-open"),
    re_path(r"^annotation/campaigns/(?P<pk>\d+)/ratings\.(?P<fmt>csv|jsonl)$", views.export, name="export"),
]
