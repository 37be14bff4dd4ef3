import sys
from pathlib import Path

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError
from tqdm import tqdm

from pipeline.formats import FormatError
from pipeline.services import BenchmarkError, benchmark_import


class Command(BaseCommand):
    help = ("Import a benchmark (JSONL, JSON, Parquet, or a folder of them in the published "
            "Personalized-RewardBench layout). All or nothing; re-importing identical content is a no-op.")

    def add_arguments(self, parser):
        parser.add_argument("path", type=Path)
        parser.add_argument("--name", required=True, help="Benchmark name (letters, digits, '.', '_', '-').")
        parser.add_argument("--description", default="")

    def handle(self, *args, path: Path, name: str, description: str, verbosity: int, **options):
        with tqdm(desc=f"import {name}", unit="item", disable=verbosity < 1, file=sys.stderr) as bar:
            def progress(done: int) -> None:
                bar.update(done - bar.n)

            try:
                result = benchmark_import(path=path, name=name, description=description, progress=progress)
            except (FormatError, BenchmarkError) as exc:
                raise CommandError(str(exc)) from None
            except ValidationError as exc:
                raise CommandError(f"--name {name!r}: {' '.join(exc.messages)}") from None
        bench = result.benchmark
        if result.created:
            self.stdout.write(f"imported {result.item_count} items as benchmark '{bench.name}' "
                              f"(sha256 {bench.content_hash[:12]})")
        else:
            self.stdout.write(f"benchmark '{bench.name}' already holds this content "
                              f"({result.item_count} items); nothing changed")
