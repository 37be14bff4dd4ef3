import json

from django.core.management.base import BaseCommand, CommandError

from leaderboard.models import OutcomeKind, Setting
from leaderboard.selectors import correlation_report
from pipeline.services import correlation_defaults
from pipeline.models import Domain


class Command(BaseCommand):
    help = ("How well each benchmark's accuracy predicts a downstream outcome (the figures of /correlations/): "
            "Spearman, Kendall tau-b, weighted tau, Pearson, NDCG (raw and shifted gains), RBO, with bootstrap CIs, "
            "permutation p-values (the method named beside each) and what a random ordering of the RMs gives.")

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
        parser.add_argument("--run", type=int, help="Use the outcomes of this Best-of-N or PPO run for the RM it "
                                                    "scored (default: each RM's most recent outcome).")
        parser.add_argument("--protocol", choices=("prbench", "release"), default="prbench",
                            help="The one protocol whose accuracies and outcomes are correlated (default prbench; "
                                 "figures of two protocols are never correlated together).")
        parser.add_argument("--format", choices=("json", "text"), default="text")

    def handle(self, *args, outcome, k, policy, domain, setting, ndcg_k, rbo_p, format, run=None, protocol="prbench",
               **options):
        if ndcg_k is not None and ndcg_k < 1:
            raise CommandError("--ndcg-k must be a positive integer")
        if not 0 < rbo_p < 1:
            raise CommandError("--rbo-p must be between 0 and 1 (exclusive)")
        report = correlation_report(kind=outcome, policy=policy, k=k, domain=domain, setting=setting,
                                    ndcg_k=ndcg_k, rbo_p=rbo_p, run=run, protocol=protocol)
        if format == "json":
            self.stdout.write(json.dumps(report, allow_nan=False))
            return
        o = report["outcome"]
        self.stdout.write(f"outcome {o['kind']}{'@' + str(o['k']) if o['k'] else ''} for policy {o['policy']} "
                          f"({o['rms']} reward models in {o['setting']}"
                          + (f", protocol {o['protocol']}" if o["protocol"] != "prbench" else "")
                          + (f"; {o['selection']})" if o["run"] is not None else ")"))
        if report.get("synthetic"):
            self.stdout.write(f"  synthetic (made up by seed_demo, not measured): {', '.join(report['synthetic'])}")
        for r in report["correlations"]:
            figures = " ".join(f"{m}={_f(r[m])}" for m in correlation_defaults()["metrics"])
            origin = " (imported)" if r.get("origin") == "imported" else ""
            self.stdout.write(f"  {r['benchmark'] + origin:<24} {r['setting'] or '-':<11} n={r['n']:<3} {figures}"
                              f" p(spearman)={_p(r['spearman'])}")
            if r.get("chance_method"):
                self.stdout.write(f"    p(kendall)={_p(r['kendall'])} p(pearson)={_p(r['pearson'])}")
                chance = " ".join(f"{m}={_chance(r[m])}" for m in correlation_defaults()["metrics"]
                                  if m != "weighted_tau")
                self.stdout.write(f"    random ordering ({r['chance_method']}): {chance}")
            for rm, why in sorted(r["dropped"].items()):
                self.stdout.write(f"    dropped {rm}: {why}")
            if r["warning"]:
                self.stdout.write(f"    warning: {r['warning']}")


DIGITS = 3  # a value and its interval, and a chance figure, always to the same number of decimals


def _f(entry: dict) -> str:
    """value[ci_low,ci_high] to DIGITS decimals; "[not enough data]" where the interval is a point."""
    if entry["value"] is None:
        return "-"
    if entry["ci_low"] is None:
        return f"{entry['value']:.{DIGITS}f}" + ("[not enough data]" if entry.get("ci_reason") else "")
    return f"{entry['value']:.{DIGITS}f}[{entry['ci_low']:.{DIGITS}f},{entry['ci_high']:.{DIGITS}f}]"


def _p(entry: dict) -> str:
    return f"{entry['p_display']} ({entry['p_method']})" if entry.get("p_display") else "-"


def _chance(entry: dict) -> str:
    chance = entry.get("chance")
    if not chance:
        return "-"
    worst = f",worst={chance['worst']:.{DIGITS}f}" if chance.get("worst") is not None else ""
    mean = round(chance["mean"], DIGITS) + 0.0  # + 0.0: a mean of -1e-17 prints 0.000, not -0.000
    return f"{mean:.{DIGITS}f}±{chance['sd']:.{DIGITS}f}{worst}"
