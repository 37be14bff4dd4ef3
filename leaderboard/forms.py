from django import forms

from pipeline.models import Benchmark, LLMEndpoint

from .models import Dtype, Kind, Setting


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
        names = list(Benchmark.objects.order_by("name").values_list("name", flat=True))
        self.fields["benchmark"].choices = [(n, n) for n in names]
        backends = LLMEndpoint.objects.filter(enabled=True).order_by("name").values_list("name", flat=True)
        self.fields["judge_backend"].choices = [("", "— local model folder —")] + [(b, b) for b in backends]
