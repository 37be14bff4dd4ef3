import sys
from pathlib import Path

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError
from tqdm import tqdm

from pipeline import formats_prb
from pipeline.formats import FORMATS, IMPORT_SPLITS, FormatError
from pipeline.services import BenchmarkError, benchmark_import


class Command(BaseCommand):
    help = ("Import a benchmark (JSONL, JSON, Parquet, or a folder of them in the published "
            "Personalized-RewardBench layout). All or nothing; re-importing identical content is a no-op.")

    def add_arguments(self, parser):
        parser.add_argument("path", type=Path)
        parser.add_argument("--name", required=True, help="Benchmark name (letters, digits, '.', '_', '-').")
        parser.add_argument("--description", default="")
        parser.add_argument("--format", default="auto", choices=FORMATS,
                            help="The file's schema: auto (detected from the first row's fields), "
                                 "personalized-rewardbench (Personalized-RewardBench / LaMP-QA rows: question, "
                                 "profile posts, rubric), personalrewardbench (PersonalRewardBench PRISM / Chatbot "
                                 "Arena rows: a user's conversations with a split column).")
        parser.add_argument("--split", choices=IMPORT_SPLITS, default=None,
                            help="The split to import when the files name splits in their paths (test-*.parquet, "
                                 "train/...); default: test. A folder holding several splits gets a line saying "
                                 "what was left out. PersonalRewardBench rows carry their own split: test only.")
        parser.add_argument("--history-size", type=int, default=formats_prb.DEFAULT_HISTORY_SIZE,
                            help="PersonalRewardBench: how many of the user's train rows a test item's history "
                                 f"samples (default {formats_prb.DEFAULT_HISTORY_SIZE}, as the authors' release).")
        parser.add_argument("--seed", type=int, default=formats_prb.DEFAULT_SEED,
                            help=f"PersonalRewardBench: history sampling seed (default {formats_prb.DEFAULT_SEED}).")
        parser.add_argument("--history-sampling", choices=formats_prb.HISTORY_SAMPLINGS, default="prbench",
                            help="PersonalRewardBench: prbench (default) keeps each repeated train row once before "
                                 "sampling a history; release samples the raw pool as the authors' release does "
                                 "(protocol release). The import says how many repeated rows were removed.")
        parser.add_argument("--category", default=None,
                            help="PersonalRewardBench: PRISM or Chatbot_Arena, for rows whose set the file "
                                 "and folder names do not tell.")

    def handle(self, *args, path: Path, name: str, description: str, verbosity: int, format: str,
               history_size: int, seed: int, category: str | None, split: str | None,
               history_sampling: str = "prbench", **options):
        with tqdm(desc=f"import {name}", unit="item", disable=verbosity < 1, file=sys.stderr) as bar:
            def progress(done: int) -> None:
                bar.update(done - bar.n)

            try:
                result = benchmark_import(path=path, name=name, description=description, progress=progress,
                                          format=format, history_size=history_size, seed=seed, category=category,
                                          split=split, history_sampling=history_sampling)
            except (FormatError, BenchmarkError) as exc:
                raise CommandError(str(exc)) from None
            except ValidationError as exc:
                raise CommandError(f"--name {name!r}: {' '.join(exc.messages)}") from None
        bench = result.benchmark
        if result.note:
            self.stdout.write(f"note: {result.note}")
        if result.created:
            self.stdout.write(f"imported {result.item_count} items as benchmark '{bench.name}' "
                              f"(sha256 {bench.content_hash[:12]})")
        else:
            self.stdout.write(f"benchmark '{bench.name}' already holds this content "
                              f"({result.item_count} items); nothing changed")
        if result.history_duplicates_removed is not None:
            self.stdout.write(f"history: {result.history_duplicates_removed} repeated train row(s) removed before "
                              f"sampling (history sampling {history_sampling}"
                              + (": the raw pool, as the authors' release)" if history_sampling == "release" else ")"))
