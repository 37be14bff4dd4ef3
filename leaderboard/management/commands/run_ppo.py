import json

from django.core.management.base import CommandError

from core.fast_exit import ModelCommand
from leaderboard.management.commands.run_best_of_n import merged_options
from leaderboard.models import RunStatus, Setting, Submission
from leaderboard.services import ppo_run_create, ppo_run_here
from pipeline.models import LLMEndpoint
from pipeline.services import run_options_help
from prblib.rewards.options import OptionsError

# The older flags, kept: each is the --option of the same knob.
FLAGS = {"steps": "steps", "batch_size": "batch_size", "response_length": "response_length",
         "eval_fraction": "eval_fraction", "seed": "seed"}


class Command(ModelCommand):
    help = ("Train a policy with PPO (TRL) against one submitted scalar RM, answer held-out questions, judge them "
            "against their rubric aspects, and store the PPO outcome.")

    def add_arguments(self, parser):
        parser.add_argument("--submission", type=int, required=True)
        parser.add_argument("--policy-model", required=True, help="Causal-LM folder under MODELS_ROOT.")
        parser.add_argument("--policy", default="Qwen2.5-0.5B-Instruct")
        parser.add_argument("--judge-endpoint", required=True)
        parser.add_argument("--judge-model", required=True)
        parser.add_argument("--option", action="append", default=[], metavar="KEY=JSON",
                            help="A PPO knob (repeatable). Keys (default): " + run_options_help("ppo"))
        parser.add_argument("--steps", type=int, help="Same as --option steps=N.")
        parser.add_argument("--batch-size", type=int, help="Same as --option batch_size=N.")
        parser.add_argument("--response-length", type=int, help="Same as --option response_length=N.")
        parser.add_argument("--eval-fraction", type=float, help="Same as --option eval_fraction=F.")
        parser.add_argument("--setting", choices=Setting.values, default=Setting.PROFILE)
        parser.add_argument("--seed", type=int, help="Same as --option seed=S.")

    def handle(self, *args, **o):
        submission = Submission.objects.filter(pk=o["submission"]).first()
        judge = LLMEndpoint.objects.filter(name=o["judge_endpoint"], enabled=True).first()
        if submission is None or judge is None:
            raise CommandError("no such submission" if submission is None else
                               f"no enabled LLM endpoint named '{o['judge_endpoint']}'")
        try:
            run = ppo_run_create(submission=submission, policy=o["policy"], policy_model=o["policy_model"],
                                 setting=o["setting"], judge=judge, judge_model=o["judge_model"],
                                 options=merged_options(o, FLAGS))
        except OptionsError as exc:
            raise CommandError(f"--option {exc}") from None
        status = ppo_run_here(run=run)
        run.refresh_from_db()
        if status != RunStatus.SUCCEEDED:
            raise CommandError(f"PPO run {run.pk} failed: {run.error}")
        self.stdout.write(json.dumps({"run": run.pk, "outcome": run.results["outcome"],
                                      "steps": run.results["training"]["steps"]}, allow_nan=False))
