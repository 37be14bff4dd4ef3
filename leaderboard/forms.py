from django import forms

from pipeline.models import Benchmark, LLMEndpoint
from prblib.rewards import presets
from prblib import registry
from core.validation import MAX_ID, BoundedJSONField, LinkFormField


from .models import Dtype


COMMON_FIELDS = ("display_name", "benchmark", "preset", "kind", "settings", "parameters", "license", "link")
LOCAL_MODEL_FIELDS = ("model_path", "dtype", "max_length", "batch_size", "profile_k")
# The form fields each of a kind's needs (prblib.registry.RMKind.needs) brings.
NEED_FIELDS = {"model_folder": LOCAL_MODEL_FIELDS, "llm": (*LOCAL_MODEL_FIELDS, "judge_backend"),
               "scores_file": ("scores_file",)}
# Kind options that have a form field of their own; the rest go in the "options" JSON.
OPTION_FORM_FIELDS = ("m", "n", "prototypes")


def kind_options() -> dict[str, tuple[str, ...]]:
    """Per kind, its options (its schema in prblib.rewards.options) that have a form field."""
    from prblib.rewards.options import options_models

    return {kind: tuple(name for name in OPTION_FORM_FIELDS if name in model.model_fields)
            for kind, model in options_models().items()}


def kind_fields() -> dict[str, tuple[str, ...]]:
    """The one place that says which form fields each kind uses, from the registry's needs and
    the kind's options: the form shows only these (static/js/submit.js hides the rest) and the
    view reads only these."""
    from prblib.rewards.options import options_models

    options = kind_options()
    fields = {}
    for kind, model in options_models().items():
        needed = dict.fromkeys(f for need in sorted(registry.kind(kind).needs) for f in NEED_FIELDS[need])
        fields[kind] = (*needed, *options[kind], *(("options",) if model.model_fields else ()))
    return fields


class OptionsField(BoundedJSONField):
    """A JSON object field (nesting and numbers bounded as on the API) that shows an empty box,
    not the text "null", when no options are given."""

    def prepare_value(self, value):
        return "" if value is None else super().prepare_value(value)


class SubmissionForm(forms.Form):
    display_name = forms.CharField(max_length=120, help_text="Shown on the leaderboard.")
    benchmark = forms.ChoiceField()
    preset = forms.ChoiceField(required=False, help_text="A model preset fixes the kind and the options its family "
                                                         "needs (see Supported models); explicit options win.")
    kind = forms.ChoiceField(required=False)  # kinds and settings: prblib.registry, read when the form is built
    settings = forms.MultipleChoiceField(widget=forms.CheckboxSelectMultiple)
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
    options = OptionsField(required=False, label="Other options (JSON)",
                           widget=forms.Textarea(attrs={"rows": 3, "placeholder": '{"both_orders": false}'}),
                           help_text='Options of the chosen kind as a JSON object, e.g. {"both_orders": false}; '
                                     "the table below lists each kind's options. Anything else is refused.")
    # Bounded as the API's SubmissionCreateSerializer and the 64-bit column are.
    parameters = forms.IntegerField(required=False, min_value=1, max_value=MAX_ID,
                                    help_text="Parameter count (optional).")
    license = forms.CharField(required=False, max_length=100)
    link = LinkFormField(required=False)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        from .services import benchmark_settings

        # A kind's fields are disabled (not sent) while another kind is chosen, so none of them
        # may be required; the service applies the defaults and checks what a kind needs.
        for name, field in self.fields.items():
            if name not in COMMON_FIELDS:
                field.required = False

        self.fields["kind"].choices = [("", "— the preset's kind —")] + registry.kind_choices()
        # A form that works as it opens: the first kind (scalar), which choosing a preset replaces.
        self.fields["kind"].initial = registry.kind_choices()[0][0]
        self.fields["preset"].choices = [("", "— none —")] + presets.preset_choices()
        self.preset_kinds = {p.name: p.kind for p in presets.PRESETS}
        self.fields["settings"].choices = registry.setting_choices()
        self.fields["settings"].initial = [s.name for s in registry.SETTINGS if s.needs is None]
        self.kind_fields = kind_fields()

        benchmarks = list(Benchmark.objects.order_by("name"))
        self.fields["benchmark"].choices = [(b.name, b.name) for b in benchmarks]
        self.benchmark_settings = {b.name: benchmark_settings(benchmark=b) for b in benchmarks}
        backends = LLMEndpoint.objects.filter(enabled=True).order_by("name").values_list("name", flat=True)
        self.fields["judge_backend"].choices = [("", "— local model folder —")] + [(b, b) for b in backends]

    def clean(self):
        data = super().clean()
        if not data.get("kind") and data.get("preset") in self.preset_kinds:
            data["kind"] = self.preset_kinds[data["preset"]]  # the preset fixes the kind
        elif not data.get("kind") and "kind" not in self.errors:
            self.add_error("kind", "Choose a kind, or a preset.")
        return data

    def kinds_of(self, name: str) -> str:
        """Space-separated kinds that use field `name` ('' for fields every kind uses)."""
        if name in COMMON_FIELDS:
            return ""
        return " ".join(kind for kind, fields in self.kind_fields.items() if name in fields)

    def kind_rows(self):
        """(bound field, kinds using it) in form order, for the template."""
        return [(field, self.kinds_of(field.name)) for field in self]
