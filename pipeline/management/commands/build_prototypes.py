import json
import sys
from pathlib import Path

from django.conf import settings
from django.core.management.base import CommandError
from tqdm import tqdm

from core.fast_exit import ModelCommand
from pipeline import formats_prb
from pipeline.management.options import parse_option_pairs
from pipeline.models import Benchmark


class Command(ModelCommand):
    help = ("P-GenRM user prototypes: embed each training user (from their preference signals, or from personas a "
            "P-GenRM judge infers, as the paper), cluster them with K-means, optionally refine them; the file goes "
            "under DATA_ROOT and is named in a pgenrm submission's options as 'prototypes'.")

    def add_arguments(self, parser):
        parser.add_argument("--benchmark", required=True, help="The training benchmark (its users and signals).")
        parser.add_argument("--out", required=True, help="JSON file under DATA_ROOT (a .npz is written beside it).")
        parser.add_argument("--k", type=int, default=50)
        parser.add_argument("--k-from-variance", type=float)
        parser.add_argument("--retriever", default="", help="Encoder folder or cached Hub id; empty: MiniLM. Its "
                            "sentence-transformers pooling config decides mean or last-token pooling.")
        parser.add_argument("--seed", type=int, default=0)
        parser.add_argument("--personas-model", default="", help="Infer personas with this P-GenRM judge (its name "
                            "at --endpoint, or a local model folder) and cluster those instead of raw histories.")
        parser.add_argument("--endpoint", metavar="NAME", help="A configured LLM endpoint (manage.py llm_endpoint "
                            "list) serving the persona judge.")
        parser.add_argument("--option", action="append", default=[], metavar="KEY=JSON",
                            help="pgenrm option for the persona judge, e.g. --option chain_format=\"published\".")
        parser.add_argument("--history-size", type=int, default=formats_prb.DEFAULT_HISTORY_SIZE,
                            help="Persona chains: at most this many of the user's other rows as history.")
        parser.add_argument("--refine", action="store_true", help="Also run the history-aware refinement and save "
                            "the refined prototypes beside the initial ones.")
        parser.add_argument("--epochs", type=int, default=1)
        parser.add_argument("--lr", type=float, default=1e-3)
        parser.add_argument("--lambda-centre", type=float, default=1e-3)
        parser.add_argument("--lambda-smooth", type=float, default=1e-3)

    def handle(self, *args, **o):
        from prblib.rewards.base import ModelSpec
        from prblib.errors import ModelError
        from prblib.rewards.options import validate_options
        from prblib.rewards.pgenrm.model import PGenRM
        from prblib.rewards.pgenrm.refine import RefineSettings
        from prblib.construction.retrieval import DenseRetriever
        from pipeline.prototypes import PrototypesError, prototypes_build

        bench = Benchmark.objects.filter(name=o["benchmark"]).first()
        if bench is None:
            raise CommandError(f"no benchmark named '{o['benchmark']}'")
        if o["k"] < 1:
            raise CommandError(f"--k must be at least 1, not {o['k']}")
        if o["history_size"] < 0:
            raise CommandError(f"--history-size must be at least 0, not {o['history_size']}")
        out = (Path(settings.DATA_ROOT) / o["out"]).resolve()
        if not out.is_relative_to(Path(settings.DATA_ROOT).resolve()):
            raise CommandError(f"--out must stay under {settings.DATA_ROOT}")
        try:
            refine = None
            if o["refine"]:
                refine = RefineSettings(epochs=o["epochs"], lr=o["lr"], lambda_centre=o["lambda_centre"],
                                        lambda_smooth=o["lambda_smooth"], seed=o["seed"])
        except ValueError as exc:
            raise CommandError(f"--refine: {exc}") from None
        judge = None
        try:
            retriever = DenseRetriever.from_name(o["retriever"]) if o["retriever"] else DenseRetriever.default()
            if o["personas_model"]:
                judge = PGenRM.load(ModelSpec(kind="pgenrm", path=o["personas_model"],
                                              options={**validate_options("pgenrm", parse_option_pairs(o["option"])),
                                                       "m": 1, "n": 0, "prototypes": None},
                                              runtime=_runtime(o)))
            elif o["endpoint"] or o["option"]:
                raise CommandError("--endpoint and --option configure the persona judge: give --personas-model too")
            with tqdm(desc="persona chains", unit="chain", file=sys.stderr,
                      disable=judge is None or o["verbosity"] < 1) as bar:
                result = prototypes_build(benchmark=bench, out=out, k=o["k"], seed=o["seed"],
                                          k_from_variance=o["k_from_variance"], retriever=retriever, judge=judge,
                                          history_size=o["history_size"], refine_settings=refine,
                                          progress=bar.update)
        except (PrototypesError, ModelError) as exc:  # OptionsError is a ModelError
            raise CommandError(str(exc)) from None
        finally:
            if judge is not None:
                judge.close()
        self.stdout.write(json.dumps({"out": str(result.path), "users": result.users, "k": result.k,
                                      "source": result.source, "refined": result.refined,
                                      "personas": result.personas or None, "losses": result.losses or None},
                                     allow_nan=False))


def _runtime(o: dict) -> dict:
    from pipeline.endpoints import EndpointError, endpoint_get, model_runtime

    try:
        endpoint = endpoint_get(name=o["endpoint"]) if o["endpoint"] else None
    except EndpointError as exc:
        raise CommandError(str(exc)) from None
    return model_runtime(kind="pgenrm", path=o["personas_model"], endpoint=endpoint)
