import json

from django.core.management.base import BaseCommand, CommandError

from jobs.services import job_enqueue
from leaderboard.models import PPORun, RunStatus, Setting, Submission
from leaderboard.services import ppo_run_execute
from pipeline.models import LLMEndpoint


class Command(BaseCommand):
    help = ("Train a policy with PPO (TRL) against one submitted scalar RM, answer held-out questions, judge them "
            "against their rubric aspects, and store the PPO outcome.")

    def add_arguments(self, parser):
        parser.add_argument("--submission", type=int, required=True)
        parser.add_argument("--policy-model", required=True, help="Causal-LM folder under MODELS_ROOT.")
        parser.add_argument("--policy", default="Qwen2.5-0.5B-Instruct")
        parser.add_argument("--judge-endpoint", required=True)
        parser.add_argument("--judge-model", required=True)
        parser.add_argument("--steps", type=int, default=64)
        parser.add_argument("--batch-size", type=int, default=8)
        parser.add_argument("--response-length", type=int, default=256)
        parser.add_argument("--eval-fraction", type=float, default=0.2)
        parser.add_argument("--setting", choices=Setting.values, default=Setting.PROFILE)
        parser.add_argument("--seed", type=int, default=0)

    def handle(self, *args, **o):
        submission = Submission.objects.filter(pk=o["submission"]).first()
        judge = LLMEndpoint.objects.filter(name=o["judge_endpoint"], enabled=True).first()
        if submission is None or judge is None:
            raise CommandError("no such submission" if submission is None else
                               f"no enabled LLM endpoint named '{o['judge_endpoint']}'")
        run = PPORun.objects.create(submission=submission, policy=o["policy"], policy_model=o["policy_model"],
                                    setting=o["setting"], judge=judge, judge_model=o["judge_model"],
                                    steps=o["steps"], batch_size=o["batch_size"],
                                    response_length=o["response_length"], seed=o["seed"],
                                    eval_fraction=o["eval_fraction"])
        job_enqueue(run, send=False)  # run here, in this process
        status = ppo_run_execute(run_id=run.pk)
        run.refresh_from_db()
        if status != RunStatus.SUCCEEDED:
            raise CommandError(f"PPO run {run.pk} failed: {run.error}")
        self.stdout.write(json.dumps({"run": run.pk, "outcome": run.results["outcome"],
                                      "steps": run.results["training"]["steps"]}, allow_nan=False))
