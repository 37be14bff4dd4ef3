import json

from django.core.management.base import BaseCommand, CommandError

from annotation.models import Campaign
from annotation.services.reports import WeakerVerdicts, campaign_record_validation, campaign_report, report_text_lines


class Command(BaseCommand):
    help = ("Print a campaign's validation report: per-dimension means with CIs, Wilcoxon, agreement, "
            "validation (--format text, the default) or the whole report as one JSON object (--format json).")

    def add_arguments(self, parser):
        parser.add_argument("--campaign", type=int, required=True)
        parser.add_argument("--format", choices=("json", "text"), default="text")
        parser.add_argument("--record-validation", action="store_true",
                            help="Also store the per-pair verdicts on the benchmark (for --validated-only exports).")
        parser.add_argument("--confirm", action="store_true",
                            help="With --record-validation: record even over verdicts of another campaign that rest "
                                 "on more ratings per pair (refused without it).")

    def handle(self, *args, campaign: int, format: str, record_validation: bool, confirm: bool = False, **options):
        obj = Campaign.objects.select_related("benchmark").filter(pk=campaign).first()
        if obj is None:
            raise CommandError(f"no campaign with id {campaign}")
        report = campaign_report(campaign=obj)
        if record_validation:
            try:
                report["recorded"] = campaign_record_validation(campaign=obj, confirm=confirm)
            except WeakerVerdicts as exc:
                raise CommandError(f"{exc} (--confirm records them)") from None
        if format == "json":
            self.stdout.write(json.dumps(report, allow_nan=False))
            return
        for line in report_text_lines(report=report):
            self.stdout.write(line)
