import json

from django.core.management.base import BaseCommand

from leaderboard.models import OutcomeKind
from leaderboard.selectors import correlation_report
from pipeline.models import Domain


class Command(BaseCommand):
    help = "How well each benchmark's accuracy predicts a downstream outcome (the figures of /correlations/)."

    def add_arguments(self, parser):
        parser.add_argument("--outcome", choices=OutcomeKind.values, default="best_of_n")
        parser.add_argument("--k", type=int, default=16)
        parser.add_argument("--policy")
        parser.add_argument("--domain", choices=Domain.values, default="")
        parser.add_argument("--format", choices=("json", "text"), default="text")

    def handle(self, *args, outcome, k, policy, domain, format, **options):
        report = correlation_report(kind=outcome, policy=policy, k=k, domain=domain)
        if format == "json":
            self.stdout.write(json.dumps(report, allow_nan=False))
            return
        o = report["outcome"]
        self.stdout.write(f"outcome {o['kind']}{'@' + str(o['k']) if o['k'] else ''} for policy {o['policy']} "
                          f"({o['rms']} reward models)")
        for r in report["correlations"]:
            self.stdout.write(f"  {r['benchmark']:<24} {r['setting'] or '-':<11} n={r['n']:<3} "
                              f"spearman={_f(r['spearman']['value'])} kendall={_f(r['kendall']['value'])} "
                              f"pearson={_f(r['pearson']['value'])} "
                              f"ndcg={_f(r['ndcg']['value'])}")


def _f(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"
