import json
import sys
from pathlib import Path

from django.conf import settings
from django.core.management.base import CommandError
from tqdm import tqdm

from core.fast_exit import ModelCommand
from pipeline.management.options import parse_option_pairs
from pipeline.manifest import evaluation_manifest, model_argument, model_shown, weights_identity
from prblib.rewards import presets
from prblib import registry
from prblib.rewards.base import ModelSpec
from prblib.errors import ModelError
from pipeline.models import Benchmark
from pipeline.services import (domain_rows, item_pair_input, progress_chunk_size, reward_model_get, rm_score_items,
                               rm_summarize, rm_usage)


class Command(ModelCommand):
    help = ("Evaluate a reward model on a benchmark in-process, with the same code the Celery task runs. "
            "The last stdout line is a JSON summary.")
    # Django's system checks import every URLconf and view (DRF, drf-spectacular, ...): about a
    # second of start-up that this command, which serves nothing, does not need.
    requires_system_checks = []

    def add_arguments(self, parser):
        parser.add_argument("--benchmark", required=True)
        parser.add_argument("--model", required=True, help="Model folder, scores JSONL, or a judge's model name.")
        parser.add_argument("--kind", choices=registry.kind_names(),
                            help="The reward-model kind (may be left out with --preset).")
        parser.add_argument("--preset", choices=presets.preset_names(), metavar="NAME",
                            help="A model preset (prblib/rewards/presets.py; the Supported models page lists them): "
                                 "fixes the kind and sets its options; --option values win.")
        parser.add_argument("--setting", required=True, choices=registry.setting_names())
        parser.add_argument("--out", type=Path, help="Per-pair results, one JSON line per pair.")
        parser.add_argument("--dump-inputs", type=Path, help="The exact texts given to the model, one JSON line per pair.")
        parser.add_argument("--limit", type=int, help="Only the first N pairs.")
        parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
        parser.add_argument("--batch-size", type=int, default=8)
        parser.add_argument("--max-length", type=int, default=4096)
        parser.add_argument("--dtype", choices=("auto", "float32", "bfloat16", "float16"), default="auto")
        parser.add_argument("--profile-k", type=int, default=10)
        parser.add_argument("--option", action="append", default=[], metavar="KEY=JSON",
                            help="Kind-specific option, e.g. --option both_orders=false (repeatable); the same "
                                 "schema as a submission's options (see the submit page). --option protocol=release "
                                 "(scalar, pairwise): what the authors' released script computes (docs/protocols.md).")
        parser.add_argument("--endpoint", metavar="NAME",
                            help="A configured LLM endpoint (manage.py llm_endpoint list) serving a judge or "
                                 "P-GenRM; --model is then the model's name there.")
        parser.add_argument("--template-file", metavar="FILE",
                            help="P-GenRM, chain_format published: an operator's {\"system\", \"user\"} JSON "
                                 "template, named relative to DATA_ROOT (e.g. the authors' own prompt).")

    def handle(self, *args, **o):
        o["model_given"], o["model"] = o["model"], self._model_path(o)
        benchmark = Benchmark.objects.filter(name=o["benchmark"]).first()
        if benchmark is None:
            raise CommandError(f"no benchmark named '{o['benchmark']}'")
        if o["limit"] is not None and o["limit"] < 1:
            raise CommandError("--limit must be at least 1")
        items = benchmark.items.order_by("position")
        if o["limit"]:
            items = items[: o["limit"]]
        total = items.count()
        self._apply_preset(o)
        spec = ModelSpec(kind=o["kind"], path=o["model"], device=o["device"], dtype=o["dtype"],
                         max_length=o["max_length"], batch_size=o["batch_size"], profile_k=o["profile_k"],
                         options=self._options(o["option"], kind=o["kind"]) if not o.get("preset_options")
                         else self._checked(o["preset_options"], kind=o["kind"]),
                         runtime=self._runtime(o, benchmark))
        try:
            model = reward_model_get(spec)
            if o["dump_inputs"]:
                self._dump_inputs(model, items, o["setting"], o["dump_inputs"])
            rows = self._score(model, items, o["setting"], o["out"], total, o["verbosity"], o["batch_size"])
        except ModelError as exc:
            raise CommandError(str(exc)) from None
        except OSError as exc:
            raise CommandError(f"{exc.filename or ''}: {exc.strerror or exc}") from None
        usage = rm_usage(model)
        shown = o["model_given"] if o["endpoint"] or Path(o["model"]).is_file() else model_shown(o["model"])
        summary = {"benchmark": benchmark.name, "model": shown, "kind": o["kind"], "setting": o["setting"],

                   **rm_summarize(rows, kind=o["kind"], options=spec.options, usage=usage, setting=o["setting"])}
        # The worker's manifest function, so a run's manifest and this one have the same keys (`rerun` reads both).
        endpoint = self._endpoint(o)
        folder = None if endpoint is not None or Path(o["model"]).is_file() else o["model"]
        try:
            weights_hash = weights_identity(kind=o["kind"], path=o["model"], endpoint=endpoint)
        except ModelError as exc:
            raise CommandError(str(exc)) from None
        summary["manifest"] = evaluation_manifest(
            kind=o["kind"], setting=o["setting"], benchmark=benchmark, model=shown, weights_hash=weights_hash,
            device=o["device"], dtype=o["dtype"], max_length=o["max_length"], batch_size=o["batch_size"],
            profile_k=o["profile_k"], options=dict(spec.options), folder=folder, judge_backend=endpoint,
            limit=o["limit"], template_file=self._template_path(spec.runtime))
        self.stdout.write(json.dumps(summary, allow_nan=False))

    def _apply_preset(self, o: dict) -> None:
        """--preset: the kind it fixes and its options under the --option values (presets.expand)."""
        if not o["preset"]:
            if not o["kind"]:
                raise CommandError("give --kind, or --preset NAME")
            return
        try:
            kind, options = presets.expand(o["preset"], o["kind"], self._options(o["option"], kind=o["kind"] or
                                                                                  presets.preset(o["preset"]).kind))
        except presets.UnknownPreset as exc:
            raise CommandError(f"--preset: {exc}") from None
        if presets.preset(o["preset"]).needs_endpoint and not o["endpoint"]:
            raise CommandError(f"--preset {o['preset']} runs on a configured endpoint: give --endpoint NAME")
        o["kind"], o["preset_options"] = kind, options

    @staticmethod
    def _model_path(o: dict) -> str:
        """--model as the loader takes it: a served model's name (with --endpoint) or a file (a
        scores JSONL) as given; a model folder relative to MODELS_ROOT as manifests write it, or to
        the current folder (`pipeline.manifest.model_argument`), made absolute."""
        raw = o["model"]
        if o.get("endpoint") or Path(raw).is_file():
            return raw
        return str(model_argument(raw))

    @staticmethod
    def _endpoint(o: dict):
        from pipeline.endpoints import EndpointError, endpoint_get

        if not o.get("endpoint"):
            return None
        try:
            return endpoint_get(name=o["endpoint"])
        except EndpointError as exc:
            raise CommandError(str(exc)) from None

    @staticmethod
    def _template_path(runtime: dict) -> str | None:
        """The operator's P-GenRM template file as the model loaded it (inside the data folder)."""
        name = runtime.get("pgenrm_template")
        return str(Path(runtime.get("data_root") or ".") / name) if name else None

    @staticmethod
    def _checked(options: dict, *, kind: str) -> dict:
        from prblib.rewards.options import OptionsError, validate_options

        try:
            return validate_options(kind, options)
        except OptionsError as exc:
            raise CommandError(f"--preset options: {exc}") from None

    @staticmethod
    def _options(pairs: list[str], *, kind: str) -> dict:
        from prblib.rewards.options import OptionsError, validate_options

        try:
            return validate_options(kind, parse_option_pairs(pairs))
        except OptionsError as exc:
            raise CommandError(f"--option {exc}") from None

    @staticmethod
    def _runtime(o: dict, benchmark: Benchmark) -> dict:
        from pipeline.endpoints import EndpointError, endpoint_get, model_runtime

        kind = registry.kind(o["kind"])
        endpoint = None
        if o["endpoint"]:
            if not kind.generative:
                raise CommandError(f"--endpoint serves generative kinds ({', '.join(registry.generative_kind_names())}), "
                                   f"not {o['kind']}")
            try:
                endpoint = endpoint_get(name=o["endpoint"])
            except EndpointError as exc:
                raise CommandError(str(exc)) from None
        # The scores file must cover the whole benchmark, even with --limit.
        ids = list(benchmark.items.values_list("source_id", flat=True)) if "scores_file" in kind.needs else None
        runtime = model_runtime(kind=o["kind"], path=o["model"], endpoint=endpoint, benchmark_ids=ids)
        if o["template_file"]:
            if not kind.template_file:
                raise CommandError(f"--template-file serves the {', '.join(registry.template_file_kind_names())} "
                                   f"kind, not {o['kind']}")
            runtime["pgenrm_template"] = o["template_file"]
        return runtime

    @staticmethod
    def _dump_inputs(model, items, setting: str, path: Path) -> None:
        from prblib.rewards.base import check_setting

        first = items.first()
        rows = domain_rows(first.benchmark_id) if first is not None else {}
        with open(path, "w", encoding="utf-8") as fh:
            for item in items.iterator(chunk_size=500):
                pair = item_pair_input(item, row_in_domain=rows.get(item.pk))
                check_setting(setting, pair)
                chosen_text, rejected_text = model.render_inputs(pair, setting=setting)
                fh.write(json.dumps({"id": pair.id, "chosen_text": chosen_text, "rejected_text": rejected_text},
                                    ensure_ascii=False, allow_nan=False) + "\n")

    @staticmethod
    def _score(model, items, setting: str, out: Path | None, total: int, verbosity: int, batch_size: int) -> list:
        rows = []
        out_fh = open(out, "w", encoding="utf-8") if out else None
        try:
            with tqdm(total=total, desc=f"{model.kind} / {setting}", unit="pair", file=sys.stderr,
                      disable=verbosity < 1) as bar:
                def on_chunk(results):
                    # In benchmark order whatever order a chunk finished in, as the worker's summary
                    # reads them, so the bootstrap draws the same pairs and the CIs agree.
                    for item, r in sorted(results, key=lambda pair: pair[0].position):
                        rows.append((item.domain, r.correct, r.tie, r.details, r.chosen_score, r.rejected_score))
                        if out_fh:
                            out_fh.write(json.dumps({"id": item.source_id, "domain": item.domain,
                                                     "chosen_score": r.chosen_score, "rejected_score": r.rejected_score,
                                                     "correct": r.correct}, allow_nan=False) + "\n")
                    bar.update(len(results))

                # The worker's chunks (same batches, so the same float scores to the last bit).
                chunk = progress_chunk_size(total=total, batch_size=batch_size, cap=settings.RUN_CHUNK_PAIRS)
                rm_score_items(model=model, items=items.iterator(chunk_size=500), setting=setting, on_chunk=on_chunk,
                               chunk_size=chunk)
        finally:
            if out_fh:
                out_fh.close()
        return rows
