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
        parser.add_argument("--without-invalid", action="store_true",
                            help="Every pair except those human annotation found invalid (pairs nobody rated are "
                                 "kept), as the version the benchmark health page cuts.")

    def handle(self, *args, name: str, out: Path, validated_only: bool, without_invalid: bool = False, **options):
        if validated_only and without_invalid:
            raise CommandError("--validated-only and --without-invalid: choose one")
        try:
            count = benchmark_export(name=name, out=out, validated_only=validated_only,
                                     without_invalid=without_invalid)
        except (FormatError, BenchmarkError) as exc:
            raise CommandError(str(exc)) from None
        except OSError as exc:
            raise CommandError(f"{out}: {exc.strerror or exc}") from None
        self.stdout.write(f"wrote {count} items of '{name}' to {out}")
