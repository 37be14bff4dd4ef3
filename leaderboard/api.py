"""Submissions and leaderboard API. Views stay thin: validation and state changes live in services."""

from collections.abc import Sequence

from django.db.models import Prefetch
from django.shortcuts import get_object_or_404
from drf_spectacular.extensions import OpenApiSerializerExtension, OpenApiSerializerFieldExtension
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema, extend_schema_field
from rest_framework import mixins, permissions, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import PermissionDenied
from rest_framework.parsers import FormParser, MultiPartParser
from rest_framework.permissions import AllowAny
from rest_framework.response import Response
from rest_framework.views import APIView

from pipeline.models import Domain
from pipeline.services import metrics_shown, per_pair_access, per_pair_withheld
from prblib.rewards.options import options_json_schema
from prblib import registry
from prblib.rewards import presets
from core import exports
from core.permissions import IsResearcher
from core.uploads import upload_refusal
from core.validation import MAX_ID, JSONBodyParser, LinkField, query_bool, query_choice, query_int

from . import selectors, services, views
from .models import DownstreamOutcome, Dtype, EvaluationRun, Submission


class RunSerializer(serializers.ModelSerializer):
    progress = serializers.SerializerMethodField()
    exports = serializers.SerializerMethodField()

    class Meta:
        model = EvaluationRun
        fields = ("id", "setting", "status", "progress", "attempts", "error", "log_tail", "metrics", "queued_at",
                  "started_at", "finished_at", "heartbeat_at", "exports")

    def get_progress(self, run) -> dict:
        return {"done": run.progress_done, "total": run.progress_total, "percent": run.progress_percent}

    def get_exports(self, run) -> dict:
        base = f"/submissions/{run.submission_id}/runs/{run.pk}/scores"
        return {"csv": f"{base}.csv", "jsonl": f"{base}.jsonl"}


class RegistryNames(Sequence):
    """A registry list of names read whenever it is used (the OpenAPI document's parameter enums are
    built per request, so a kind added to prblib.registry is listed without a restart).
    `names`: a function of no arguments returning the names, e.g. registry.kind_names."""

    def __init__(self, names):
        self._names = names

    def __getitem__(self, index):
        return self._names()[index]

    def __len__(self):
        return len(self._names())


class KindOptionsField(serializers.DictField):
    """A JSON object checked against the chosen kind's schema by the submission service."""


class KindOptionsFieldSchema(OpenApiSerializerFieldExtension):
    """The OpenAPI schema of `options`: one of the registry's kinds' option schemas, read when the
    document is generated."""

    target_class = KindOptionsField

    def map_serializer_field(self, auto_schema, direction):
        return {"type": "object",
                "description": "Options of the chosen kind; anything else is a 400 naming the key. Endpoints, API "
                               "keys and folders are never options (generative kinds name a staff-configured "
                               "judge_backend).",
                "oneOf": [{**options_json_schema(kind), "title": f"{kind} options"} for kind in registry.kind_names()]}


class OutcomeSerializer(serializers.ModelSerializer):
    """A downstream outcome of the submission with the manifest that reproduces it."""

    class Meta:
        model = DownstreamOutcome
        fields = ("id", "kind", "policy", "setting", "domain", "k", "outcome", "ci_low", "ci_high", "n", "source",
                  "synthetic", "config_key", "run", "manifest", "created_at")

    run = serializers.SerializerMethodField(help_text="The Best-of-N or PPO run that recorded it ({type, id}); "
                                                      "null for imported and synthetic outcomes.")

    @extend_schema_field({"type": "object", "nullable": True, "properties": {
        "type": {"type": "string", "enum": [o.name for o in registry.OUTCOME_KINDS if o.run_options]},
        "id": {"type": "integer"}}})
    def get_run(self, outcome) -> dict | None:
        return outcome.run_ref


class SubmissionSerializer(serializers.ModelSerializer):
    benchmark = serializers.CharField(source="benchmark.name")
    owner = serializers.CharField(source="owner.username")
    judge_backend = serializers.CharField(source="judge_backend.name", default=None, allow_null=True)
    model_path = serializers.CharField(source="model_shown", read_only=True, help_text=(
        "The model folder relative to the models folder, a served model's name, or hf:org/name@revision "
        "for a Hugging Face Hub snapshot."))
    runs = RunSerializer(many=True)
    outcomes = OutcomeSerializer(many=True, read_only=True)
    status = serializers.SerializerMethodField()

    class Meta:
        model = Submission
        fields = ("id", "display_name", "owner", "benchmark", "kind", "model_path", "judge_backend", "weights_hash",
                  "dtype", "max_length", "batch_size", "profile_k", "options", "parameters", "license", "link",
                  "published", "published_at", "created_at", "status", "runs", "outcomes")

    def to_representation(self, submission):
        data = super().to_representation(submission)
        request = self.context.get("request")
        if request is None or not services.can_act(request.user, submission):
            for run in data["runs"]:
                run["log_tail"] = ""  # worker paths and tracebacks: for the owner and staff only
        viewer = request.user if request is not None else None
        # Calibration bins are per-pair data (pipeline/blindness.py); a staff owner is "prbench staff".
        withheld = per_pair_withheld(viewer, submission.benchmark_id) if viewer is not None else None
        for run in data["runs"]:
            run["metrics"] = metrics_shown(run["metrics"], withheld)
        data["owner"] = submission.owner_shown_to(viewer)
        return data

    def get_status(self, submission) -> str:
        """The least advanced run's status: a submission is done when all its runs are."""
        return submission.overall_status


class SubmissionCreateSerializer(serializers.Serializer):
    """Every field bounded as its column is, so bad input is a 400 naming the field, never a database error."""

    display_name = serializers.CharField(max_length=120)
    benchmark = serializers.CharField(max_length=100)
    kind = serializers.ChoiceField(choices=(), required=False, allow_blank=True, default="", help_text=(
        "The reward-model kind; may be left out when `preset` names one (the preset's kind)."))
    preset = serializers.ChoiceField(choices=(), required=False, allow_blank=True, default="", help_text=(
        "A model preset (the Supported models page, /models/supported/, lists them): fixes the kind and sets the options it needs (an "
        "option given explicitly wins); recorded as options.model_preset."))
    settings = serializers.ListField(child=serializers.ChoiceField(choices=()), allow_empty=False)
    model_path = serializers.CharField(required=False, allow_blank=True, default="", max_length=500)
    judge_backend = serializers.CharField(required=False, allow_blank=True, default="", max_length=50)
    scores_file = serializers.FileField(required=False, allow_null=True, default=None)
    dtype = serializers.ChoiceField(choices=Dtype.choices, default=Dtype.AUTO)
    max_length = serializers.IntegerField(default=4096, min_value=64, max_value=131072)
    batch_size = serializers.IntegerField(default=8, min_value=1, max_value=512)
    profile_k = serializers.IntegerField(default=10, min_value=0, max_value=50)
    options = KindOptionsField(required=False, default=dict)
    parameters = serializers.IntegerField(required=False, allow_null=True, default=None, min_value=1,
                                          max_value=MAX_ID)
    license = serializers.CharField(required=False, allow_blank=True, default="", max_length=100)
    link = LinkField(required=False, allow_blank=True, default="")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # prblib.registry is the one list of kinds and settings (the OpenAPI enums follow it too).
        self.fields["kind"].choices = registry.kind_choices()
        self.fields["preset"].choices = presets.preset_choices()
        self.fields["settings"] = serializers.ListField(
            child=serializers.ChoiceField(choices=registry.setting_choices()), allow_empty=False,
            min_length=1, max_length=len(registry.SETTINGS))  # min_length: the schema's minItems


class SubmissionViewSet(exports.JSONErrorsMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin,
                        mixins.CreateModelMixin, viewsets.GenericViewSet):
    """Reward-model submissions. Researchers list, create and act on their own (staff: all).
    One submission (and its per-pair scores) is readable by anyone once published, and only
    by its owner and staff before: to anyone else a private submission is a 404."""

    permission_classes = [IsResearcher]
    public_actions = ("retrieve", "scores")

    def get_permissions(self):
        if self.action in self.public_actions:
            return [permissions.AllowAny()]
        return super().get_permissions()
    parser_classes = [JSONBodyParser, MultiPartParser, FormParser]
    lookup_value_regex = r"[0-9]+"  # anything else is a 404, never a ValueError
    serializer_class = SubmissionSerializer
    filterset_fields = ["kind"]

    queryset = Submission.objects.none()  # schema generation; get_queryset is the real one

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return Submission.objects.none()
        if self.action == "list":
            return selectors.submissions_visible(user=self.request.user)
        return (selectors.submissions_visible_to(self.request.user)
                .select_related("benchmark", "owner", "judge_backend")
                .prefetch_related(Prefetch("runs", queryset=EvaluationRun.objects.order_by("setting")), "outcomes"))

    @extend_schema(request=SubmissionCreateSerializer, responses={
        201: SubmissionSerializer, 400: OpenApiResponse(description="Refused: the body names the field and why."),
        413: OpenApiResponse(description="An uploaded file is larger than MAX_UPLOAD_MB."),
        429: OpenApiResponse(description="SUBMISSIONS_PER_HOUR reached (refused attempts count too).")})
    def create(self, request, *args, **kwargs):
        try:
            services.submission_rate_check(user=request.user)  # before the body (and its upload) is read
        except services.SubmissionRefused as exc:
            return Response({"detail": str(exc)}, status=exc.status)
        data = SubmissionCreateSerializer(data=request.data)
        refusal = upload_refusal(request)
        if refusal is not None:
            services.submission_attempt_refused(user=request.user)  # counts toward the hourly limit
            field, message = refusal
            return Response({"detail": message, field: [message]}, status=status.HTTP_413_REQUEST_ENTITY_TOO_LARGE)
        data.is_valid(raise_exception=True)
        try:
            submission = services.submission_create(
                user=request.user, request=services.SubmissionRequest(**data.validated_data))
        except services.SubmissionRefused as exc:
            body = {"detail": str(exc)}
            body.update({field: messages for field, messages in exc.errors.items() if field})
            if exc.link:
                body["existing"] = exc.link
            return Response(body, status=exc.status)
        return Response(self.get_serializer(self.get_queryset().get(pk=submission.pk)).data,
                        status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses={200: SubmissionSerializer})
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        return self._act(services.submission_cancel, pk)

    @extend_schema(request=None, responses={
        200: SubmissionSerializer,
        429: OpenApiResponse(description="SUBMISSIONS_PER_HOUR reached: a retry counts as a submission attempt.")})
    @action(detail=True, methods=["post"])
    def retry(self, request, pk=None):
        return self._act(services.submission_retry, pk)

    @extend_schema(request=None, responses={200: SubmissionSerializer})
    @action(detail=True, methods=["post"])
    def publish(self, request, pk=None):
        """Make the submission public (one-way for owners)."""
        return self._act(services.submission_publish, pk)

    def _act(self, service, pk):
        submission = get_object_or_404(self.get_queryset(), pk=pk)
        try:
            service(user=self.request.user, submission=submission)
        except PermissionError as exc:
            return Response({"detail": str(exc)}, status=status.HTTP_403_FORBIDDEN)
        except services.SubmissionRefused as exc:  # a retry past the hourly limit (429)
            return Response({"detail": str(exc)}, status=exc.status)
        return Response(self.get_serializer(self.get_queryset().get(pk=pk)).data)

    @extend_schema(parameters=[OpenApiParameter("run", {"type": "integer", "minimum": 1, "maximum": MAX_ID},
                                                required=True),
                               OpenApiParameter("format", str, enum=list(exports.FORMATS),
                                                description="jsonl (default) or csv")],
                   responses=exports.EXPORT_SCHEMA_RESPONSES)
    @action(detail=True, methods=["get"], renderer_classes=exports.EXPORT_RENDERERS)
    def scores(self, request, pk=None):
        """Per-pair results of one run, as JSON lines (default) or CSV."""
        submission = get_object_or_404(self.get_queryset(), pk=pk)
        withheld = per_pair_access(request.user, submission.benchmark_id, what="submission scores API")
        if withheld:
            raise PermissionDenied(withheld)
        run = get_object_or_404(EvaluationRun, pk=query_int(request.query_params, "run", required=True, low=1),
                                submission=submission)
        return views.export_response(run, request.accepted_renderer.format)


class LeaderboardRowSerializer(serializers.Serializer):
    rank = serializers.IntegerField(allow_null=True, help_text="Significance group: rows sharing a rank are not "
                                                               "significantly different (McNemar, Holm).")
    submission_id = serializers.IntegerField()
    display_name = serializers.CharField()
    owner = serializers.CharField()
    rm = serializers.CharField(help_text="owner/display_name: names are unique per owner.")
    kind = serializers.CharField()
    setting = serializers.CharField()
    benchmark = serializers.CharField()
    # None where the run's metrics lack the figure (no pairs in the chosen domain).
    accuracy = serializers.FloatField(allow_null=True)
    ci_low = serializers.FloatField(allow_null=True)
    ci_high = serializers.FloatField(allow_null=True)
    tie_rate = serializers.FloatField(allow_null=True)
    n = serializers.IntegerField(allow_null=True)
    by_domain = serializers.DictField()
    parameters = serializers.IntegerField(allow_null=True)
    license = serializers.CharField()
    link = serializers.CharField()
    published = serializers.BooleanField(help_text="False only on the viewer's own unpublished rows.")
    finished_at = serializers.DateTimeField(allow_null=True)
    protocol = serializers.CharField(help_text="The rules behind the figure: prbench (ours) or release (what the "
                                               "authors' released script computes); docs/protocols.md.")
    protocol_label = serializers.CharField()
    protocol_definition = serializers.CharField(help_text="One line: what the protocol computes for this kind.")
    strict_accuracy = serializers.FloatField(allow_null=True, help_text="Pairwise judges under release: the same "
                                             "verdicts with an unreadable one counted wrong instead of as A.")


class LeaderboardTableSerializer(serializers.Serializer):
    benchmark = serializers.CharField()
    setting = serializers.CharField()
    protocol = serializers.CharField(help_text="The rules every figure of the table follows; tables of two protocols "
                                               "are ranked apart.")
    rows = LeaderboardRowSerializer(many=True)


class LeaderboardAnswerSerializer(serializers.Serializer):
    """The leaderboard's answer: its rows, or with ?tables=true its tables (LeaderboardAnswerSchema)."""


class LeaderboardAnswerSchema(OpenApiSerializerExtension):
    """Either list: anyOf, since an empty answer is both."""

    target_class = LeaderboardAnswerSerializer

    def map_serializer(self, auto_schema, direction):
        rows = auto_schema.resolve_serializer(LeaderboardRowSerializer, direction).ref
        tables = auto_schema.resolve_serializer(LeaderboardTableSerializer, direction).ref
        return {"anyOf": [{"title": "rows (default)", "type": "array", "items": rows},
                          {"title": "tables (?tables=true)", "type": "array", "items": tables}]}


SORT_ORDERS = ("desc", "asc")


class LeaderboardView(APIView):
    """Public leaderboard: one row per succeeded submission and setting, grouped as one ranked
    table per (benchmark, setting) (ranks compare rows of the same table only). `?tables=true`
    returns the tables themselves: [{benchmark, setting, rows}]. A filter, sort or order value
    the leaderboard does not have is a 400 naming the ones it has."""

    permission_classes = [AllowAny]

    @extend_schema(parameters=[
        OpenApiParameter("benchmark", str), OpenApiParameter("kind", str, enum=RegistryNames(registry.kind_names)),
        OpenApiParameter("setting", str, enum=RegistryNames(registry.setting_names)), OpenApiParameter("domain", str, enum=Domain.values),
        OpenApiParameter("sort", str, enum=list(selectors.SORT_KEYS), description="Default accuracy."),
        OpenApiParameter("order", str, enum=list(SORT_ORDERS), description="Default desc."),
        OpenApiParameter("q", str, description="Keep models whose name contains this (any case)."),
        OpenApiParameter("tables", bool, description="Nest rows in one table per (benchmark, setting)."),
    ], responses=LeaderboardAnswerSerializer)
    def get(self, request):
        p = request.query_params
        tables = selectors.leaderboard_tables(
            benchmark=p.get("benchmark") or None, kind=query_choice(p, "kind", registry.kind_names()),
            setting=query_choice(p, "setting", registry.setting_names()),
            domain=query_choice(p, "domain", Domain.values),
            sort=query_choice(p, "sort", list(selectors.SORT_KEYS)) or "accuracy",
            descending=query_choice(p, "order", SORT_ORDERS) != "asc", viewer=request.user, search=p.get("q") or None)
        if query_bool(p, "tables"):
            return Response(LeaderboardTableSerializer(tables, many=True).data)
        return Response(LeaderboardRowSerializer([r for t in tables for r in t["rows"]], many=True).data)


_STRINGS = {"type": "array", "items": {"type": "string"}}
# The outline of selectors.correlation_report (the README's "Correlations" lists every field).
CORRELATION_REPORT = {"type": "object", "required": ["outcome", "policies", "settings", "definitions", "correlations",
                                                     "curves", "stability", "synthetic"], "properties": {
    "outcome": {"type": "object", "required": ["kind", "policy", "k", "domain", "setting", "rms"]},
    "policies": _STRINGS, "settings": _STRINGS,
    "definitions": {"type": "object", "additionalProperties": {"type": "string"}},
    "correlations": {"type": "array", "items": {"type": "object", "required": ["benchmark", "setting", "n", "points"]}},
    "curves": {"type": "object", "additionalProperties": {"type": "array", "items": {"type": "object"}}},
    "stability": {"type": "object", "nullable": True},
    "synthetic": {**_STRINGS, "description": "RMs whose outcomes used here are made up (seed_demo), not measured"}}}


class CorrelationsView(APIView):
    """How well each benchmark's RM accuracy predicts a downstream outcome (public)."""

    permission_classes = [AllowAny]

    @extend_schema(parameters=[
        OpenApiParameter("outcome", str, enum=RegistryNames(registry.outcome_kind_names)),
        OpenApiParameter("k", {"type": "integer", "minimum": 1, "maximum": selectors.K_MAX},
                         description=f"Best-of-k (default {registry.KS[-1]})"),
        OpenApiParameter("policy", str), OpenApiParameter("domain", str, enum=Domain.values),
        OpenApiParameter("setting", str, enum=RegistryNames(registry.setting_names),
                         description="Outcomes' setting for other benchmarks, curves and stability (default profile); "
                                     "given, it is used for every row"),
        OpenApiParameter("ndcg_k", {"type": "integer", "minimum": 1, "maximum": selectors.NDCG_K_MAX},
                         description="NDCG cutoff (default none)"),
        OpenApiParameter("rbo_p", {"type": "number", "enum": list(selectors.RBO_P_CHOICES)},
                         description="RBO persistence (default 0.9)"),
        OpenApiParameter("run", {"type": "integer", "minimum": 1, "maximum": selectors.RUN_ID_MAX},
                         description="The Best-of-N or PPO run whose outcome to use for the RM it scored (default: "
                                     "each RM's most recent outcome; `outcome.selection` says which rule applied)"),
        OpenApiParameter("protocol", str, enum=[p.name for p in registry.PROTOCOLS],
                         description="The one protocol whose accuracies and outcomes are correlated (default "
                                     "prbench; `outcome.protocol` names it)")],
        responses={200: OpenApiResponse(CORRELATION_REPORT, description="Correlations per benchmark and setting "
                                        "with every metric's definition (`definitions`), curves, stability.")})
    def get(self, request):
        try:
            params = selectors.correlation_params(request.query_params)
        except selectors.ParamError as exc:
            raise serializers.ValidationError({exc.field: [exc.message]}) from None
        return Response(selectors.correlation_report(**params))
