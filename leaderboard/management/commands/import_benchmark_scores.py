from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from leaderboard.services import ImportRefused, external_scores_import


class Command(BaseCommand):
    help = ("Import reward models' accuracies on other benchmarks (CSV or JSON: benchmark, the RM as submission "
            "(our id) or rm + source (an external model), accuracy, optional setting). All or nothing.")

    def add_arguments(self, parser):
        parser.add_argument("path", type=Path)

    def handle(self, *args, path, **options):
        try:
            count = external_scores_import(path=path)
        except ImportRefused as exc:
            raise CommandError(str(exc)) from None
        except OSError as exc:
            raise CommandError(f"{path}: {exc.strerror or exc}") from None
        self.stdout.write(f"imported {count} benchmark scores from {path}")
