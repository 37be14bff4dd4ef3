from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from leaderboard.models import OutcomeKind, Setting
from leaderboard.services import ImportRefused, outcomes_import


class Command(BaseCommand):
    help = ("Import downstream outcomes computed elsewhere (CSV or JSON: the RM as submission (our id) or rm + "
            "source (an external model), domain, outcome, n; optional kind, policy, k, setting). All or nothing.")

    def add_arguments(self, parser):
        parser.add_argument("path", type=Path)
        parser.add_argument("--kind", choices=OutcomeKind.values, help="For rows without a kind column.")
        parser.add_argument("--policy", help="For rows without a policy column.")
        parser.add_argument("--setting", choices=Setting.values,
                            help="For rows without a setting column (default profile): the setting the RM scored in.")

    def handle(self, *args, path, kind, policy, setting, **options):
        try:
            count = outcomes_import(path=path, kind=kind, policy=policy, setting=setting)
        except ImportRefused as exc:
            raise CommandError(str(exc)) from None
        except OSError as exc:
            raise CommandError(f"{path}: {exc.strerror or exc}") from None
        self.stdout.write(f"imported {count} outcomes from {path}")
