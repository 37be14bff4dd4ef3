import json

from django.core.management.base import CommandError

from core.fast_exit import ModelCommand
from pipeline.build import BuildError, benchmark_rank_profiles
from pipeline.services import BenchmarkError


class Command(ModelCommand):
    help = ("Write a new frozen version of a benchmark whose profiles are each question's top-k posts ranked by a "
            "dense retriever (for sources whose profiles are unranked).")

    def add_arguments(self, parser):
        parser.add_argument("--benchmark", required=True)
        parser.add_argument("--retriever", required=True,
                            help="Retriever model folder, or a Hugging Face id already in the local cache.")
        parser.add_argument("--name", required=True, help="Name of the new version.")
        parser.add_argument("--k", type=int, default=10, help="Posts kept per profile (default 10, the paper's).")

    def handle(self, *args, benchmark, retriever, name, k, **options):
        try:
            new = benchmark_rank_profiles(source=benchmark, name=name, retriever=retriever, k=k)
        except (BuildError, BenchmarkError) as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(json.dumps({"benchmark": new.name, "items": new.item_count, "derived_from": benchmark,
                                      "retriever": retriever, "k": k}))
