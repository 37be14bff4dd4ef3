"""GET /api/jobs/ (the caller's jobs of every kind; staff: all) and cancel/retry of one job."""

from django.http import Http404
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from . import selectors, services
from .models import JobStatus

# The kinds of job installed (fixed while the process runs): GET ?type= and the action URLs take these.
JOB_TYPES = [model.job_type for model in services.job_models()]


class JobSerializer(serializers.Serializer):
    """The documented shape of one job (built by selectors.job_as_dict)."""

    type = serializers.CharField()
    id = serializers.IntegerField()
    title = serializers.CharField()
    status = serializers.CharField()
    progress = serializers.DictField(help_text="{done, total, percent}")
    attempts = serializers.IntegerField()
    reason = serializers.CharField(help_text="Why the job failed or was cancelled (empty otherwise).")
    error = serializers.CharField(help_text="The same as reason (the name runs use in /api/submissions/).")
    worker = serializers.CharField(help_text="The host:pid that ran it last; staff only (empty for others).")
    owner = serializers.CharField(help_text="Username of the job's owner; empty for kinds without one (builds, "
                                            "sample sets: staff's).")
    duration_seconds = serializers.FloatField(allow_null=True, help_text="Seconds from start to finish (to now "
                                                                           "while it runs); null before it starts.")
    url = serializers.CharField()
    created_at = serializers.DateTimeField()
    queued_at = serializers.DateTimeField(allow_null=True)
    started_at = serializers.DateTimeField(allow_null=True)
    heartbeat_at = serializers.DateTimeField(allow_null=True)
    finished_at = serializers.DateTimeField(allow_null=True)
    can_cancel = serializers.BooleanField()
    can_retry = serializers.BooleanField()
    cancel_url = serializers.CharField()
    retry_url = serializers.CharField()


class JobListView(APIView):
    @extend_schema(parameters=[OpenApiParameter("type", str, enum=JOB_TYPES),
                               OpenApiParameter("status", str, enum=JobStatus.values),
                               OpenApiParameter("owner", str, description="a username: only the jobs of that "
                                                "user's submissions (staff; others see only their own)")],
                   responses={200: inline_serializer("JobList", {"count": serializers.IntegerField(),
                                                                 "results": JobSerializer(many=True)}),
                              400: OpenApiResponse(description="unknown type or status")})
    def get(self, request):
        try:
            jobs = selectors.jobs_list(user=request.user, job_type=request.query_params.get("type", ""),
                                       status=request.query_params.get("status", ""),
                                       owner=request.query_params.get("owner", ""))
        except services.JobRefused as exc:
            return Response({"detail": str(exc)}, status=400)
        return Response({"count": len(jobs), "results": [selectors.job_as_dict(j, user=request.user) for j in jobs]})


class JobActionView(APIView):
    action = ""

    @extend_schema(parameters=[OpenApiParameter("job_type", str, OpenApiParameter.PATH, enum=JOB_TYPES)],
                   request=None, responses={200: JobSerializer, 404: OpenApiResponse(description="no such job"),
                                            409: OpenApiResponse(description="not allowed now; detail says why"),
                                            429: OpenApiResponse(description="a retry past the hourly submission "
                                                                             "limit (SUBMISSIONS_PER_HOUR)")})
    def post(self, request, job_type: str, pk: int):
        try:
            job = services.job_act(user=request.user, job_type=job_type, pk=pk, action=self.action)
        except services.JobNotFound:
            raise Http404 from None
        except services.JobRefused as exc:
            return Response({"detail": str(exc)}, status=exc.status)
        return Response(selectors.job_as_dict(job, user=request.user))
