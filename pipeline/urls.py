from django.urls import path

from . import views

app_name = "pipeline"
urlpatterns = [
    path("", views.benchmark_list, name="benchmark-list"),
    path("<str:name>/", views.benchmark_detail, name="benchmark-detail"),
    path("<str:name>/items/<int:pk>/", views.item_detail, name="item-detail"),
]
