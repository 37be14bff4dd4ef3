from django.urls import path

from . import views

app_name = "jobs"

urlpatterns = [
    path("jobs/", views.job_list, name="list"),
    path("jobs/<str:job_type>/<int:pk>/cancel/", views.job_action, {"action": "cancel"}, name="cancel"),
    path("jobs/<str:job_type>/<int:pk>/retry/", views.job_action, {"action": "retry"}, name="retry"),
]
