import json

from django.core.management.base import CommandError

from core.fast_exit import ModelCommand
from pipeline.build import BuildError, benchmark_plan
from pipeline.services import BenchmarkError


class Command(ModelCommand):
    help = ("Write a new frozen version of a benchmark with planner aspects for the plan setting (any benchmark, "
            "e.g. the imported published dataset). Cached: a rerun after a failure pays only for what failed.")

    def add_arguments(self, parser):
        parser.add_argument("--benchmark", required=True, help="The benchmark to plan.")
        parser.add_argument("--planner", default="", help="Staff-configured LLM endpoint (empty: a local folder).")
        parser.add_argument("--planner-model", required=True,
                            help="Model name at --planner, or a causal-LM folder under MODELS_ROOT.")
        parser.add_argument("--name", required=True, help="Name of the new version.")
        parser.add_argument("--seed", type=int, default=0)

    def handle(self, *args, benchmark, planner, planner_model, name, seed, **options):
        try:
            new, usage = benchmark_plan(source=benchmark, name=name, planner=planner, planner_model=planner_model,
                                        seed=seed)
        except (BuildError, BenchmarkError) as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(json.dumps({"benchmark": new.name, "items": new.item_count, "derived_from": benchmark,
                                      "usage": usage}, allow_nan=False))
