"""Convert an InternLM2 reward checkpoint (custom code, refused as it is) into a built-in
LlamaForSequenceClassification folder under MODELS_ROOT, submitted afterwards as an ordinary scalar RM.
The checkpoint's Python is never run, imported or copied (prblib/rewards/convert_internlm2.py says why the
result computes the same scores)."""

import json

from django.conf import settings
from django.core.management.base import CommandError

from prblib.errors import ModelError
from core.fast_exit import ModelCommand


class Command(ModelCommand):
    help = ("Rewrite an InternLM2 reward model (InternLM2ForRewardModel, safetensors) as transformers' "
            "LlamaForSequenceClassification in a new folder; both folders are relative to MODELS_ROOT. "
            "Prints one JSON line: the new folder, tensors, parameters and the reward token.")
    requires_system_checks = []

    def add_arguments(self, parser):
        parser.add_argument("source", help="The InternLM2 reward checkpoint's folder, relative to MODELS_ROOT.")
        parser.add_argument("dest", help="A new folder to write, relative to MODELS_ROOT (must not exist).")

    def handle(self, *args, **o):
        from prblib.rewards.convert_internlm2 import convert_internlm2

        try:
            result = convert_internlm2(o["source"], o["dest"], models_root=settings.MODELS_ROOT)
        except ModelError as exc:
            raise CommandError(str(exc)) from None
        except OSError as exc:
            raise CommandError(f"{exc.filename or ''}: {exc.strerror or exc}") from None
        for note in result.notes:
            self.stderr.write(f"note: {note}")
        self.stdout.write(json.dumps({
            "folder": str(result.folder.relative_to(settings.MODELS_ROOT.resolve())), "kind": "scalar",
            "tensors": result.tensors, "parameters": result.parameters, "reward_token": result.reward_token}))
