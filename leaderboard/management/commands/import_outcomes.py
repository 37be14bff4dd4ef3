from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from leaderboard.models import OutcomeKind
from leaderboard.services import ImportRefused, outcomes_import


class Command(BaseCommand):
    help = ("Import downstream outcomes computed elsewhere (CSV or JSON: rm, domain, outcome, n, source; "
            "optional kind, policy, k). All or nothing.")

    def add_arguments(self, parser):
        parser.add_argument("path", type=Path)
        parser.add_argument("--kind", choices=OutcomeKind.values, help="For rows without a kind column.")
        parser.add_argument("--policy", help="For rows without a policy column.")

    def handle(self, *args, path, kind, policy, **options):
        try:
            count = outcomes_import(path=path, kind=kind, policy=policy)
        except ImportRefused as exc:
            raise CommandError(str(exc)) from None
        except OSError as exc:
            raise CommandError(f"{path}: {exc.strerror or exc}") from None
        self.stdout.write(f"imported {count} outcomes from {path}")
