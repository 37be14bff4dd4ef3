from django import forms

from pipeline.models import Benchmark, LLMEndpoint

from .models import Dtype, Kind, Setting


COMMON_FIELDS = ("display_name", "benchmark", "kind", "settings", "parameters", "license", "link")
LOCAL_MODEL_FIELDS = ("model_path", "dtype", "max_length", "batch_size", "profile_k")
JUDGE_FIELDS = (*LOCAL_MODEL_FIELDS, "judge_backend")
# Kind options that have a field of their own on the form; the rest go in the "options" JSON.
OPTION_FORM_FIELDS = ("m", "n", "prototypes")


def _kind_options() -> dict[str, tuple[str, ...]]:
    """Per kind, its options (pipeline.ml.options.OPTIONS, the one schema) that have a form field."""
    from pipeline.ml.options import OPTIONS

    return {kind: tuple(name for name in OPTION_FORM_FIELDS if name in model.model_fields)
            for kind, model in OPTIONS.items()}


def _kind_fields() -> dict[str, tuple[str, ...]]:
    """The one place that says which form fields each kind uses: the form shows only these
    (static/js/submit.js hides the rest) and the view reads only these."""
    from pipeline.ml.options import OPTIONS

    base = {Kind.SCALAR: LOCAL_MODEL_FIELDS, Kind.PAIRWISE: JUDGE_FIELDS, Kind.POINTWISE: JUDGE_FIELDS,
            Kind.SCORES: ("scores_file",), Kind.PGENRM: JUDGE_FIELDS}
    return {kind: (*fields, *KIND_OPTIONS[kind], *(("options",) if OPTIONS[kind].model_fields else ()))
            for kind, fields in base.items()}


KIND_OPTIONS: dict[str, tuple[str, ...]] = _kind_options()
KIND_FIELDS: dict[str, tuple[str, ...]] = _kind_fields()


class SubmissionForm(forms.Form):
    display_name = forms.CharField(max_length=120, help_text="Shown on the leaderboard.")
    benchmark = forms.ChoiceField()
    kind = forms.ChoiceField(choices=Kind.choices)
    settings = forms.MultipleChoiceField(choices=Setting.choices, widget=forms.CheckboxSelectMultiple,
                                         initial=[Setting.NO_PROFILE, Setting.PROFILE])
    model_path = forms.CharField(required=False, max_length=500,
                                 help_text="Model folder relative to the models folder (scalar, local judges), "
                                           "or the model name served by the judge backend.")
    judge_backend = forms.ChoiceField(required=False, help_text="Generative judges served by an endpoint.")
    scores_file = forms.FileField(required=False, help_text="Uploaded scores: JSONL of {id, chosen_score, rejected_score}.")
    dtype = forms.ChoiceField(choices=Dtype.choices, initial=Dtype.AUTO)
    max_length = forms.IntegerField(initial=4096, min_value=64, max_value=131072)
    batch_size = forms.IntegerField(initial=8, min_value=1, max_value=512)
    profile_k = forms.IntegerField(initial=10, min_value=0, max_value=50, label="Profile posts (k)")
    m = forms.IntegerField(required=False, min_value=1, max_value=64, initial=4, label="P-GenRM m",
                           help_text="P-GenRM: evaluation chains sampled per pair for the user.")
    n = forms.IntegerField(required=False, min_value=0, max_value=256, initial=0, label="P-GenRM n",
                           help_text="P-GenRM: similar users whose preferences are also consulted.")
    prototypes = forms.CharField(required=False, max_length=500, label="P-GenRM prototypes",
                                 help_text="Prototypes JSON under the data folder (needed when n > 0).")
    options = forms.JSONField(required=False, label="Other options (JSON)",
                              help_text='Options of the chosen kind as a JSON object, e.g. {"both_orders": false}; '
                                        "the table below lists each kind's options. Anything else is refused.")
    parameters = forms.IntegerField(required=False, min_value=1, help_text="Parameter count (optional).")
    license = forms.CharField(required=False, max_length=100)
    link = forms.URLField(required=False, assume_scheme="https")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        from .services import benchmark_settings

        # A kind's fields are disabled (not sent) while another kind is chosen, so none of them
        # may be required; the service applies the defaults and checks what a kind needs.
        for name, field in self.fields.items():
            if name not in COMMON_FIELDS:
                field.required = False

        benchmarks = list(Benchmark.objects.order_by("name"))
        self.fields["benchmark"].choices = [(b.name, b.name) for b in benchmarks]
        self.benchmark_settings = {b.name: benchmark_settings(benchmark=b) for b in benchmarks}
        backends = LLMEndpoint.objects.filter(enabled=True).order_by("name").values_list("name", flat=True)
        self.fields["judge_backend"].choices = [("", "— local model folder —")] + [(b, b) for b in backends]

    def kinds_of(self, name: str) -> str:
        """Space-separated kinds that use field `name` ('' for fields every kind uses)."""
        if name in COMMON_FIELDS:
            return ""
        return " ".join(kind for kind, fields in KIND_FIELDS.items() if name in fields)

    def kind_rows(self):
        """(bound field, kinds using it) in form order, for the template."""
        return [(field, self.kinds_of(field.name)) for field in self]
