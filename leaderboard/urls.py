from django.urls import path, re_path

from . import health_views, views
from . import preset_views  # the supported models (issue 30)
from . import paper_views  # the paper table (issue 30)

app_name = "leaderboard"
urlpatterns = [
    path("submit/", views.submit, name="submit"),
    path("submit/example-scores.jsonl", views.example_scores, name="example-scores"),
    re_path(r"^leaderboard\.(?P<fmt>csv|json)$", views.leaderboard_export, name="leaderboard-export"),
    path("models/supported/", preset_views.supported_models, name="supported-models"),
    path("paper/", paper_views.paper, name="paper"),
    re_path(r"^paper\.(?P<fmt>tex|md|csv)$", paper_views.paper_export, name="paper-export"),
    path("correlations/", views.correlations, name="correlations"),
    path("benchmarks/<str:name>/health/", health_views.health_page, name="health"),
    path("benchmarks/<str:name>/health.csv", health_views.health_csv, name="health-csv"),
    path("benchmarks/<str:name>/health/reannotate/", health_views.reannotate, name="health-reannotate"),
    path("benchmarks/<str:name>/health/cut/", health_views.cut_version, name="health-cut"),
    path("correlations.csv", views.correlations_csv, name="correlations-csv"),
    path("models/<int:pk>/", views.model_page, name="model"),
    path("models/<int:pk>/pairs/", views.model_pairs, name="model-pairs"),
    path("models/<int:pk>/pairs/<int:item_pk>/", views.model_pair, name="model-pair"),
    path("models/<int:pk>/compare/", views.model_compare, name="model-compare"),
    re_path(r"^models/(?P<pk>\d+)/predictions\.(?P<fmt>csv|jsonl)$", views.model_predictions,
            name="model-predictions"),
    path("submissions/", views.submission_list, name="submission-list"),
    path("submissions/<int:pk>/", views.submission_detail, name="submission"),
    re_path(r"^submissions/(?P<pk>\d+)/(?P<action>cancel|retry|publish)/$", views.submission_action, name="submission-action"),
    re_path(r"^submissions/(?P<pk>\d+)/runs/(?P<run_id>\d+)/scores\.(?P<fmt>csv|jsonl)$", views.run_export,
            name="run-export"),
]
