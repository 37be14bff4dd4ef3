from django.urls import path

from . import views

app_name = "pipeline"
urlpatterns = [
    path("benchmarks/", views.benchmark_list, name="benchmark-list"),
    path("benchmarks/<str:name>/", views.benchmark_detail, name="benchmark-detail"),
    path("benchmarks/<str:name>/items/<int:pk>/", views.item_detail, name="item-detail"),
    path("pipeline/builds/", views.build_list, name="build-list"),
    path("pipeline/builds/<int:pk>/", views.build_detail, name="build-detail"),
    path("pipeline/builds/<int:pk>/resume/", views.build_resume_view, name="build-resume"),
]
