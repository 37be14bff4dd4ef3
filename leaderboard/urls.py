from django.urls import path, re_path

from . import views

app_name = "leaderboard"
urlpatterns = [
    path("submit/", views.submit, name="submit"),
    path("correlations/", views.correlations, name="correlations"),
    path("correlations.csv", views.correlations_csv, name="correlations-csv"),
    path("submissions/<int:pk>/", views.submission_detail, name="submission"),
    re_path(r"^submissions/(?P<pk>\d+)/(?P<action>cancel|retry|publish)/$", views.submission_action, name="submission-action"),
    re_path(r"^submissions/(?P<pk>\d+)/runs/(?P<run_id>\d+)/scores\.(?P<fmt>csv|jsonl)$", views.run_export,
            name="run-export"),
]
