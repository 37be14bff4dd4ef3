import json

from django.core.management.base import BaseCommand, CommandError

from jobs.services import job_enqueue
from leaderboard.models import BestOfNRun, RunStatus, Setting, Submission
from leaderboard.services import bon_run_execute
from pipeline.downstream import samples_generate
from pipeline.models import BuildStatus, LLMEndpoint, PolicySampleSet


class Command(BaseCommand):
    help = ("Best-of-N for one submitted RM: sample N answers per question from a policy (once, reused), "
            "pick best-of-k for k in the registry's grid (powers of two below N, then N), judge the picks against the rubric, store the outcomes.")

    def add_arguments(self, parser):
        parser.add_argument("--submission", type=int, required=True)
        parser.add_argument("--policy-model", required=True, help="Model at --policy-endpoint, or a causal-LM "
                                                                  "folder under MODELS_ROOT.")
        parser.add_argument("--policy-endpoint", default="")
        parser.add_argument("--policy", default="Qwen2.5-0.5B-Instruct", help="Policy name shown in results.")
        parser.add_argument("--n", type=int, default=16)
        parser.add_argument("--temperature", type=float, default=0.8)
        parser.add_argument("--seed", type=int, default=0)
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
        sample_set, _ = PolicySampleSet.objects.get_or_create(
            benchmark=submission.benchmark, policy=o["policy"], endpoint=endpoints.get("policy_endpoint"),
            model=o["policy_model"], n=o["n"], temperature=o["temperature"], seed=o["seed"])
        if sample_set.status != BuildStatus.SUCCEEDED and samples_generate(sample_set=sample_set) != "SUCCEEDED":
            sample_set.refresh_from_db()
            raise CommandError(f"sampling failed: {sample_set.error} (run again to resume)")
        run, _ = BestOfNRun.objects.get_or_create(submission=submission, sample_set=sample_set, setting=o["setting"],
                                                  judge=endpoints["judge_endpoint"], judge_model=o["judge_model"])
        if run.status != RunStatus.SUCCEEDED:
            job_enqueue(run, send=False)  # run here, in this process
            if bon_run_execute(run_id=run.pk) != RunStatus.SUCCEEDED:
                run.refresh_from_db()
                raise CommandError(f"Best-of-N failed: {run.error}")
        run.refresh_from_db()
        self.stdout.write(json.dumps({"submission": submission.pk, "benchmark": submission.benchmark.name,
                                      "policy": sample_set.policy, "results": run.results}, allow_nan=False))
