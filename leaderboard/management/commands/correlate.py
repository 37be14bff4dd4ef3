import json

from django.core.management.base import BaseCommand, CommandError

from leaderboard.models import OutcomeKind, Setting
from leaderboard.selectors import correlation_report
from pipeline.services import correlation_defaults
from pipeline.models import Domain


class Command(BaseCommand):
    help = ("How well each benchmark's accuracy predicts a downstream outcome (the figures of /correlations/): "
            "Spearman, Kendall tau-b, weighted tau, Pearson, NDCG (raw and shifted gains), RBO, with bootstrap CIs.")

    def add_arguments(self, parser):
        parser.add_argument("--outcome", choices=OutcomeKind.values, default="best_of_n")
        parser.add_argument("--k", type=int, default=16)
        parser.add_argument("--policy")
        parser.add_argument("--domain", choices=Domain.values, default="")
        parser.add_argument("--setting", choices=Setting.values,
                            help="Outcomes' setting for every row (default: each row's own; other benchmarks: profile).")
        parser.add_argument("--ndcg-k", type=int, help="NDCG cutoff (default: none).")
        rbo_p = correlation_defaults()["rbo_p"]
        parser.add_argument("--rbo-p", type=float, default=rbo_p, help=f"RBO persistence (default {rbo_p}).")
        parser.add_argument("--format", choices=("json", "text"), default="text")

    def handle(self, *args, outcome, k, policy, domain, setting, ndcg_k, rbo_p, format, **options):
        if ndcg_k is not None and ndcg_k < 1:
            raise CommandError("--ndcg-k must be a positive integer")
        if not 0 < rbo_p < 1:
            raise CommandError("--rbo-p must be between 0 and 1 (exclusive)")
        report = correlation_report(kind=outcome, policy=policy, k=k, domain=domain, setting=setting,
                                    ndcg_k=ndcg_k, rbo_p=rbo_p)
        if format == "json":
            self.stdout.write(json.dumps(report, allow_nan=False))
            return
        o = report["outcome"]
        self.stdout.write(f"outcome {o['kind']}{'@' + str(o['k']) if o['k'] else ''} for policy {o['policy']} "
                          f"({o['rms']} reward models in {o['setting']})")
        for r in report["correlations"]:
            figures = " ".join(f"{m}={_f(r[m])}" for m in correlation_defaults()["metrics"])
            self.stdout.write(f"  {r['benchmark']:<24} {r['setting'] or '-':<11} n={r['n']:<3} {figures}"
                              f" p(spearman)={r['spearman']['p_display'] or '-'}")
            if r["warning"]:
                self.stdout.write(f"    warning: {r['warning']}")


def _f(entry: dict) -> str:
    if entry["value"] is None:
        return "-"
    if entry["ci_low"] is None:
        return f"{entry['value']:.3f}"
    return f"{entry['value']:.3f}[{entry['ci_low']:.2f},{entry['ci_high']:.2f}]"
