"""Rerun what a manifest describes: the same benchmark, weights, tokenizer, chat template, data
files and options, through `evaluate_rm`, so its per-pair scores can be compared with the
original's."""

import json
from pathlib import Path

from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from pipeline.manifest import configuration, model_argument, weights_identity
from prblib.errors import ModelError
from prblib.rewards.options import OptionsError
from prblib.rows import RowError, load_json
from pipeline.models import Benchmark

# The manifest keys a rerun needs (pipeline.manifest.evaluation_manifest writes them all).
REQUIRED = ("kind", "setting", "benchmark", "benchmark_content_hash", "model", "weights_hash", "dtype", "max_length",
            "batch_size", "profile_k", "options")
# What must be the same on this machine for the rerun to be the same evaluation.
CHECKED = ("tokenizer_sha256", "chat_template_sha256", "data_files")
MAX_MANIFEST_BYTES = 4 << 20


class Command(BaseCommand):
    help = ("Rerun the evaluation a manifest describes (an evaluation run's manifest, from its submission page or "
            "/api/submissions/{id}/, or evaluate_rm's last line): checks the benchmark content, the weights, the "
            "tokenizer, the chat template and the data files are the ones recorded, then runs evaluate_rm with the "
            "recorded options, limits and setting. --out writes the per-pair scores to compare with the original's.")

    def add_arguments(self, parser):
        parser.add_argument("manifest", type=Path, help="A JSON file: the manifest, or an object holding it "
                                                        "under 'manifest' (evaluate_rm's summary, a run's metrics).")
        parser.add_argument("--out", type=Path, help="Per-pair results, one JSON line per pair (as evaluate_rm).")
        parser.add_argument("--device", choices=("cpu", "cuda"),
                            help="Device (default: the manifest's; scores can move across devices and dtypes).")

    def handle(self, *args, manifest: Path, out: Path | None, device: str | None, **options):
        m = self._read(manifest)
        benchmark = Benchmark.objects.filter(name=m["benchmark"]).first()
        if benchmark is None:
            raise CommandError(f"{manifest.name}: no benchmark named '{m['benchmark']}' here (import it first)")
        if benchmark.content_hash != m["benchmark_content_hash"]:
            raise CommandError(f"{manifest.name}: benchmark '{benchmark.name}' here has other content "
                               f"({benchmark.content_hash[:12]}, the manifest's {m['benchmark_content_hash'][:12]})")
        endpoint = self._endpoint(m)
        served = endpoint is not None
        path = m["model"] if served or Path(m["model"]).is_file() else str(model_argument(m["model"]))
        try:
            weights = weights_identity(kind=m["kind"], path=path, endpoint=endpoint)
            here = configuration(kind=m["kind"], options=m["options"], dtype=m["dtype"], max_length=m["max_length"],
                                 profile_k=m["profile_k"], folder=None if served or Path(path).is_file() else path)
        except (ModelError, OptionsError, OSError) as exc:
            raise CommandError(f"{manifest.name}: {exc}") from None
        if weights != m["weights_hash"]:
            raise CommandError(f"{manifest.name}: the weights of {m['model']} here are not the ones recorded "
                               f"(sha256 {weights[:12]}, the manifest's {str(m['weights_hash'])[:12]})")
        differ = [key for key in CHECKED if key in m and m[key] != here.get(key)]
        if differ:
            raise CommandError(f"{manifest.name}: {', '.join(differ)} of {m['model']} here differ from the manifest's")
        args = ["evaluate_rm", "--benchmark", benchmark.name, "--model", m["model"], "--kind", m["kind"],
                "--setting", m["setting"], "--device", device or m.get("device") or "cpu", "--dtype", m["dtype"],
                "--max-length", str(m["max_length"]), "--batch-size", str(m["batch_size"]),
                "--profile-k", str(m["profile_k"])]
        for key, value in sorted(m["options"].items()):
            args += ["--option", f"{key}={json.dumps(value)}"]
        if m.get("limit"):
            args += ["--limit", str(m["limit"])]
        if served:
            args += ["--endpoint", endpoint.name]
        if out is not None:
            args += ["--out", str(out)]
        call_command(*args, stdout=self.stdout, stderr=self.stderr, verbosity=options.get("verbosity", 1))

    @staticmethod
    def _read(path: Path) -> dict:
        try:
            if path.stat().st_size > MAX_MANIFEST_BYTES:
                raise CommandError(f"{path.name}: larger than {MAX_MANIFEST_BYTES >> 20} MiB, not a manifest")
            data = load_json(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError) as exc:
            raise CommandError(f"{path.name}: {getattr(exc, 'strerror', None) or exc}") from None
        except RowError as exc:
            raise CommandError(f"{path.name}: not JSON ({exc})") from None
        if isinstance(data, dict) and isinstance(data.get("manifest"), dict):
            data = data["manifest"]
        if not isinstance(data, dict):
            raise CommandError(f"{path.name}: a manifest is a JSON object")
        missing = [key for key in REQUIRED if key not in data]
        if missing:
            raise CommandError(f"{path.name}: not an evaluation manifest (missing {', '.join(missing)})")
        if not isinstance(data["options"], dict):
            raise CommandError(f"{path.name}: 'options' must be a JSON object")
        return data

    @staticmethod
    def _endpoint(m: dict):
        from pipeline.endpoints import EndpointError, endpoint_get

        if not m.get("judge_backend"):
            return None
        try:
            return endpoint_get(name=m["judge_backend"])
        except EndpointError as exc:
            raise CommandError(str(exc)) from None
