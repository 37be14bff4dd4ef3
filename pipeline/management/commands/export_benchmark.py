from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from pipeline.formats import FormatError
from pipeline.services import BenchmarkError, benchmark_export


class Command(BaseCommand):
    help = "Export a benchmark in the published schema (.jsonl, .json or .parquet, by the file's suffix)."

    def add_arguments(self, parser):
        parser.add_argument("--name", required=True)
        parser.add_argument("--out", required=True, type=Path)
        parser.add_argument("--validated-only", action="store_true",
                            help="Only the pairs that human annotation validated.")

    def handle(self, *args, name: str, out: Path, validated_only: bool, **options):
        try:
            count = benchmark_export(name=name, out=out, validated_only=validated_only)
        except (FormatError, BenchmarkError) as exc:
            raise CommandError(str(exc)) from None
        except OSError as exc:
            raise CommandError(f"{out}: {exc.strerror or exc}") from None
        self.stdout.write(f"wrote {count} items of '{name}' to {out}")
