import json

from django.core.management.base import BaseCommand, CommandError

from annotation.models import Campaign
from annotation.services import campaign_record_validation, campaign_report


class Command(BaseCommand):
    help = "Print a campaign's validation report (per-dimension means and CIs, Wilcoxon, agreement, validation)."

    def add_arguments(self, parser):
        parser.add_argument("--campaign", type=int, required=True)
        parser.add_argument("--format", choices=("json", "text"), default="text")
        parser.add_argument("--record-validation", action="store_true",
                            help="Also store the per-pair verdicts on the benchmark (for --validated-only exports).")

    def handle(self, *args, campaign: int, format: str, record_validation: bool, **options):
        obj = Campaign.objects.filter(pk=campaign).first()
        if obj is None:
            raise CommandError(f"no campaign with id {campaign}")
        report = campaign_report(campaign=obj)
        if record_validation:
            report["recorded"] = campaign_record_validation(campaign=obj)
        if format == "json":
            self.stdout.write(json.dumps(report, allow_nan=False))
            return
        self.stdout.write(f"{obj.name} ({obj.benchmark.name}): {report['n_ratings']} ratings of {report['n_pairs']} "
                          f"pairs by {report['n_annotators']} annotators")
        for dim, summary in report["dimensions"].items():
            overall = summary["overall"]
            self.stdout.write(f"  {dim:<17} chosen {_f(overall['chosen']['mean'])}  rejected "
                              f"{_f(overall['rejected']['mean'])}  Wilcoxon p={_f(overall['wilcoxon']['p'], 4)}  "
                              f"alpha={_f(report['agreement'][dim]['alpha'])}")
        v = report["validation"]
        self.stdout.write(f"  valid pairs: {v['valid']}, invalid: {v['invalid']}")


def _f(value, digits: int = 2) -> str:
    return "—" if value is None else f"{value:.{digits}f}"
