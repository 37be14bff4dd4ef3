import json

from django.core.management.base import CommandError

from core.fast_exit import ModelCommand
from leaderboard.models import RunStatus, Setting, Submission
from leaderboard.services import bon_run_create, bon_run_here
from pipeline.models import LLMEndpoint
from pipeline.services import option_pairs, run_options_help
from prblib.errors import ModelError
from prblib.rewards.options import OptionsError

# The older flags, kept: each is the --option of the same knob.
FLAGS = {"n": "n", "temperature": "temperature", "seed": "seed"}


class Command(ModelCommand):
    help = ("Best-of-N for one submitted RM: sample N answers per question from a policy (once, reused), "
            "pick best-of-k for k in the registry's grid (powers of two below N, then N), judge the picks against the rubric, store the outcomes.")

    def add_arguments(self, parser):
        parser.add_argument("--submission", type=int, required=True)
        parser.add_argument("--policy-model", required=True, help="Model at --policy-endpoint, or a causal-LM "
                                                                  "folder under MODELS_ROOT.")
        parser.add_argument("--policy-endpoint", default="")
        parser.add_argument("--policy", default="Qwen2.5-0.5B-Instruct", help="Policy name shown in results.")
        parser.add_argument("--option", action="append", default=[], metavar="KEY=JSON",
                            help="A sampling knob (repeatable). Keys (default): " + run_options_help("best_of_n"))
        parser.add_argument("--n", type=int, help="Same as --option n=N.")
        parser.add_argument("--temperature", type=float, help="Same as --option temperature=T.")
        parser.add_argument("--seed", type=int, help="Same as --option seed=S.")
        parser.add_argument("--judge-endpoint", required=True)
        parser.add_argument("--judge-model", required=True)
        parser.add_argument("--setting", choices=Setting.values, default=Setting.PROFILE)

    def handle(self, *args, **o):
        submission = Submission.objects.select_related("benchmark").filter(pk=o["submission"]).first()
        if submission is None:
            raise CommandError(f"no submission {o['submission']}")
        endpoints = {}
        for key in ("policy_endpoint", "judge_endpoint"):
            if o[key]:
                endpoints[key] = LLMEndpoint.objects.filter(name=o[key], enabled=True).first()
                if endpoints[key] is None:
                    raise CommandError(f"no enabled LLM endpoint named '{o[key]}'")
        try:
            run = bon_run_create(submission=submission, policy=o["policy"], policy_model=o["policy_model"],
                                 policy_endpoint=endpoints.get("policy_endpoint"),
                                 judge=endpoints["judge_endpoint"], judge_model=o["judge_model"],
                                 setting=o["setting"], options=merged_options(o, FLAGS))
        except OptionsError as exc:
            raise CommandError(f"--option {exc}") from None
        except ModelError as exc:
            raise CommandError(str(exc)) from None
        if bon_run_here(run=run) != RunStatus.SUCCEEDED:
            run.refresh_from_db()
            raise CommandError(f"Best-of-N failed: {run.error}")
        run.refresh_from_db()
        self.stdout.write(json.dumps({"submission": submission.pk, "benchmark": submission.benchmark.name,
                                      "policy": run.sample_set.policy, "results": run.results}, allow_nan=False))


def merged_options(o: dict, flags: dict[str, str]) -> dict:
    """--option pairs plus the older per-knob flags; a knob given both ways is refused."""
    options = option_pairs(o["option"])
    for flag, key in flags.items():
        if o.get(flag) is not None:
            if key in options and options[key] != o[flag]:
                raise CommandError(f"--{flag.replace('_', '-')} {o[flag]} and --option {key}={options[key]} disagree")
            options[key] = o[flag]
    return options
