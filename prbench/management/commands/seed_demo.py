import secrets
from pathlib import Path

from django.conf import settings
from django.contrib.auth.models import Group, User
from django.core.management.base import BaseCommand, CommandError

from pipeline.formats import FormatError
from pipeline.services import BenchmarkError, benchmark_import
from prbench.roles import ANNOTATOR, RESEARCHER, ROLE_GROUPS

SAMPLE_PATH = Path(settings.BASE_DIR) / "pipeline" / "sample_data"
SAMPLE_NAME = "prb-sample"
DEMO_ACCOUNTS = (
    ("admin", {"is_staff": True, "is_superuser": True}, ()),
    ("researcher", {}, (RESEARCHER,)),
    ("annotator", {}, (ANNOTATOR,)),
)


class Command(BaseCommand):
    help = "Load the synthetic sample benchmark and, in DEBUG only, demo accounts with fresh passwords."

    def handle(self, *args, **options):
        for name in ROLE_GROUPS:
            Group.objects.get_or_create(name=name)
        try:
            result = benchmark_import(path=SAMPLE_PATH, name=SAMPLE_NAME)
        except (FormatError, BenchmarkError) as exc:
            raise CommandError(f"sample benchmark: {exc}") from None
        state = "loaded" if result.created else "already loaded"
        self.stdout.write(f"sample benchmark '{SAMPLE_NAME}': {result.item_count} items ({state})")

        if not settings.DEBUG:
            self.stdout.write("DEBUG is off: no demo accounts created (use createsuperuser).")
            return
        self.stdout.write("demo accounts (passwords are new on every run):")
        for username, flags, groups in DEMO_ACCOUNTS:
            user, _ = User.objects.get_or_create(username=username, defaults={"email": f"{username}@demo.invalid"})
            for flag, value in flags.items():
                setattr(user, flag, value)
            password = secrets.token_urlsafe(9)
            user.set_password(password)
            user.save()
            user.groups.set(Group.objects.filter(name__in=groups))
            self.stdout.write(f"  {username:<11} {password}")
