from django.urls import path

from . import api

urlpatterns = [
    path("jobs/", api.JobListView.as_view(), name="api-jobs"),
    path("jobs/<str:job_type>/<int:pk>/cancel/", api.JobActionView.as_view(action="cancel"), name="api-job-cancel"),
    path("jobs/<str:job_type>/<int:pk>/retry/", api.JobActionView.as_view(action="retry"), name="api-job-retry"),
]
