import json
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from pipeline.models import Benchmark


class Command(BaseCommand):
    help = ("P-GenRM user prototypes: embed each training user's preference signals (profile posts, earlier "
            "pairs) and cluster them with K-means; the file goes under DATA_ROOT and is named in a pgenrm "
            "submission's options as 'prototypes'.")

    def add_arguments(self, parser):
        parser.add_argument("--benchmark", required=True, help="The training benchmark (its users and signals).")
        parser.add_argument("--out", required=True, help="JSON file under DATA_ROOT (a .npz is written beside it).")
        parser.add_argument("--k", type=int, default=50)
        parser.add_argument("--k-from-variance", type=float)
        parser.add_argument("--retriever", default="", help="Encoder folder or cached Hub id; empty: MiniLM.")
        parser.add_argument("--seed", type=int, default=0)

    def handle(self, *args, **o):
        from pipeline.ml.pgenrm import build_prototypes, embedder_meta
        from pipeline.ml.retrieval import DenseRetriever

        bench = Benchmark.objects.filter(name=o["benchmark"]).first()
        if bench is None:
            raise CommandError(f"no benchmark named '{o['benchmark']}'")
        out = (Path(settings.DATA_ROOT) / o["out"]).resolve()
        if not out.is_relative_to(Path(settings.DATA_ROOT).resolve()):
            raise CommandError(f"--out must stay under {settings.DATA_ROOT}")
        users: dict[str, dict] = {}
        for item in bench.items.order_by("position").iterator(chunk_size=500):
            user = users.setdefault(item.user_id or item.source_id, {"profile": [], "history": []})
            user["profile"].extend(p.get("text", "") for p in item.profile if isinstance(p, dict))
            user["history"].extend(item.history or [])
        retriever = (DenseRetriever.from_name(o["retriever"]) if o["retriever"] else DenseRetriever.default())
        prototypes = build_prototypes(users, embed=retriever.embed, k=o["k"], seed=o["seed"],
                                      k_from_variance=o["k_from_variance"], embedder=embedder_meta(retriever))
        out.parent.mkdir(parents=True, exist_ok=True)
        prototypes.save(out)
        self.stdout.write(json.dumps({"out": str(out), "users": len(prototypes.user_ids), "k": prototypes.k},
                                     allow_nan=False))
