import sys

from django.core.exceptions import ValidationError
from django.core.management.base import CommandError
from tqdm import tqdm

from core.fast_exit import ModelCommand
from pipeline.build import BuildError, build_create, build_enqueue, build_execute, build_resume
from pipeline.models import BuildItem, BuildRun, BuildStatus, Domain


class Command(ModelCommand):
    help = ("Build a benchmark from LaMP-QA files (retrieve profiles, generate chosen/rejected answers, plan), "
            "in-process with the same stages as the Celery task. --resume ID continues a stopped build.")

    def add_arguments(self, parser):
        parser.add_argument("--source", help="LaMP-QA file or folder under DATA_ROOT.")
        parser.add_argument("--name", help="Name of the new benchmark.")
        parser.add_argument("--generator-model", help="Model name at --generator, or a causal-LM folder under "
                                                      "MODELS_ROOT.")
        parser.add_argument("--generator", default="", help="Staff-configured LLM endpoint name.")
        parser.add_argument("--planner-model", default="")
        parser.add_argument("--planner", default="")
        parser.add_argument("--domains", nargs="*", choices=Domain.values, default=[])
        parser.add_argument("--split", default="")
        parser.add_argument("--limit", type=int)
        parser.add_argument("--k", type=int, default=10)
        parser.add_argument("--retriever", default="")
        parser.add_argument("--temperature", type=float, default=0.7)
        parser.add_argument("--seed", type=int, default=0)
        parser.add_argument("--resume", type=int, metavar="BUILD_ID")
        parser.add_argument("--skip-failed", action="store_true",
                            help="With --resume: finish with the items that succeeded.")

    def handle(self, *args, **o):
        try:
            if o["resume"]:
                build = BuildRun.objects.filter(pk=o["resume"]).first()
                if build is None:
                    raise CommandError(f"no build with id {o['resume']}")
                build_resume(build=build, skip_failed=o["skip_failed"], enqueue=False)
            else:
                missing = [f"--{n}" for n in ("source", "name", "generator_model") if not o[n]]
                if missing:
                    raise CommandError(f"missing {', '.join(m.replace('_', '-') for m in missing)}")
                build = build_create(
                    user=None, name=o["name"], source_path=o["source"],
                    generator=o["generator"], generator_model=o["generator_model"], planner=o["planner"],
                    planner_model=o["planner_model"], domains=o["domains"], split=o["split"], limit=o["limit"],
                    profile_k=o["k"], retriever=o["retriever"], temperature=o["temperature"], seed=o["seed"])
                build_enqueue(build=build, send=False)
        except (BuildError, ValidationError) as exc:
            raise CommandError(" ".join(getattr(exc, "messages", [str(exc)]))) from None

        bars: dict[str, tqdm] = {}

        def progress(stage: str, n: int) -> None:
            if stage not in bars:
                total = BuildItem.objects.filter(build_id=build.pk).count()
                bars[stage] = tqdm(total=total, desc=stage, unit="item", file=sys.stderr,
                                   disable=o["verbosity"] < 1)
            bars[stage].update(n)

        status = build_execute(build_id=build.pk, progress=progress)
        for bar in bars.values():
            bar.close()
        build.refresh_from_db()
        self.stdout.write(f"build {build.pk} {status}: {build.counts}")
        if status != BuildStatus.SUCCEEDED:
            for source_id, stage, error in build.items.exclude(error="").order_by("position").values_list(
                    "source_id", "error_stage", "error"):
                self.stderr.write(f"  {source_id} [{stage}]: {error}")
            raise CommandError(f"build {build.pk} failed: {build.error} (resume with --resume {build.pk})")
        self.stdout.write(f"benchmark '{build.benchmark.name}' has {build.benchmark.item_count} items")
