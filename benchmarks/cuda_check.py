"""The CUDA path, checked on a GPU machine: placement, dtypes, scores against CPU, memory, speed.

Not a `bench_*.py` (`make bench` does not run it, and CI has no GPU). Two steps:

    # here (CPU): the tokenizer's files and the synthetic pairs into a folder
    .venv/bin/python benchmarks/cuda_check.py prepare .gpu
    # on the GPU machine: plain ML code only (prblib, no Django), torch with CUDA
    python3 benchmarks/cuda_check.py run .gpu --out result.json

`run` checks, and exits non-zero if any check fails (every check runs; the JSON holds all figures,
those reported without a verdict marked "ok": null). Scores are compared by the engine's own
self-check rule, |a - b| <= tolerance x (1 + |b|), and must all be finite:
  1. scalar RMs (tiny Llama and Qwen2 decoders on the prefix-cache engine, a tiny BERT encoder),
     loaded with device "cuda" and dtype auto / float16 / float32: every parameter and buffer on
     the GPU and every floating-point parameter in the dtype asked for (auto = bfloat16, float16
     where bf16 is unsupported); the engine mode the CPU load chose kept (a prefix-cache engine
     that fell back to full scoring would be slower); scores against the plain full forward in
     the same dtype on the GPU (the engine's SELF_CHECK_TOLERANCE: 1e-3 float32, 5e-2 bf16, 2e-2
     fp16); against float32 on the CPU (float32: 1e-3; for bf16/fp16 the largest difference and
     the share of pairs whose preferred response is the same are reported, not judged: that is
     half precision's own rounding); close() hands the memory back
     (torch.cuda.memory_allocated within 1 MiB of what it was before the load);
  2. Best-of-16 groups on CUDA (bf16): the engine, in prefix mode, against the plain forward, as in 1;
  3. speed on a larger random Llama RM (hidden 1024, 8 layers, ~130M parameters) built on the
     GPU machine, bf16: the engine (prefix cache; its time includes rendering the prompts)
     against the plain full forward of bench_scoring.py (batches of 8, right padded, texts
     rendered beforehand) on the same 48 pairs in the same process: responses/s of each, their
     ratio, peak GPU memory of each (weights included), scores within the bf16 tolerance;
  4. local generation (the LocalCausalLMBackend behind generative and P-GenRM judges) on CUDA,
     dtype auto: every parameter on the GPU in bf16 (fp16 without bf16), a seeded sample
     repeated gives the same text and another seed differs, greedy decoding repeats, the
     caller's CPU and CUDA random states are untouched, close() frees the memory.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import TextMaker, build_tiny_llama_rm  # noqa: E402  (common also puts the project root on sys.path)

SEED = 0
PAIRS, GROUPS, GROUP_SIZE = 48, 4, 16
MIB = 2 ** 20
BIG = {"hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 8, "num_attention_heads": 16,
       "num_key_value_heads": 16}  # ~130M parameters with the 30,522-token vocabulary


def prepare(folder: Path) -> None:
    """What `run` needs from this machine: the WordPiece tokenizer's files (its package is not on
    the GPU machine) and the synthetic data. The models are built by `run` itself (the same
    builders, fixed seeds), so nothing larger than the tokenizer travels."""
    import shutil

    from prblib.rewards.demo_model import minilm_tokenizer_folder

    folder.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(folder / "tokenizer", ignore_errors=True)
    (folder / "tokenizer").mkdir()
    for path in minilm_tokenizer_folder().iterdir():
        if path.is_file() and ("token" in path.name or path.name in ("vocab.txt", "special_tokens_map.json")):
            shutil.copy(path, folder / "tokenizer" / path.name)
    maker = TextMaker(SEED)
    pairs = [{"id": f"p{i}", "question": maker.question(), "profile": list(maker.profile()),
              "chosen": maker.response(), "rejected": maker.response()} for i in range(PAIRS)]
    groups = [{"id": f"g{i}", "question": maker.question(), "profile": list(maker.profile()),
               "responses": [maker.response() for _ in range(GROUP_SIZE)]} for i in range(GROUPS)]
    (folder / "data.json").write_text(json.dumps({"pairs": pairs, "groups": groups}))
    print(f"prepared {folder}: tokenizer/ ({', '.join(sorted(p.name for p in (folder / 'tokenizer').iterdir()))}), "
          f"data.json ({PAIRS} pairs, {GROUPS} groups)")


def build_models(folder: Path, tokenizer_folder: Path) -> None:
    """The tiny models (random weights, fixed seeds, float32 safetensors) into `folder`: the
    benchmarks' Llama RM, the tests' Qwen2 and BERT RMs, a 2-layer Llama causal LM."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from prblib.rewards import demo_model
    from prblib.tiny_models import build_decoder_rm, build_encoder_rm, load_tokenizer

    demo_model.minilm_tokenizer_folder = lambda: tokenizer_folder  # the tokenizer files carried here
    build_tiny_llama_rm(folder / "llama", seed=SEED)
    build_decoder_rm(folder / "qwen", arch="qwen2", seed=SEED)
    build_encoder_rm(folder / "bert", seed=SEED)
    tokenizer = load_tokenizer()
    torch.manual_seed(SEED)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=2048,
                         pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.cls_token_id, eos_token_id=None)
    LlamaForCausalLM(config).float().save_pretrained(folder / "lm", safe_serialization=True)
    tokenizer.save_pretrained(folder / "lm")


class Checks:
    def __init__(self):
        self.results: list[dict] = []

    def check(self, name: str, ok: bool, **figures) -> bool:
        self.results.append({"check": name, "ok": bool(ok), **figures})
        self._show("ok" if ok else "FAIL", name, figures)
        return ok

    def report(self, name: str, **figures) -> None:
        """A figure recorded for people to read, with no pass/fail (e.g. half precision's rounding)."""
        self.results.append({"check": name, "ok": None, **figures})
        self._show("info", name, figures)

    @staticmethod
    def _show(mark: str, name: str, figures: dict) -> None:
        shown = ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in figures.items())
        print(f"[{mark}] {name}: {shown}", flush=True)

    @contextlib.contextmanager
    def section(self, name: str):
        """A section that raises is one failed check; the sections after it still run."""
        try:
            yield
        except Exception as exc:  # noqa: BLE001 - recorded, the run goes on
            traceback.print_exc()
            self.check(f"{name}: ran to the end", False, error=f"{type(exc).__name__}: {exc}"[:400])


def run(folder: Path, out: Path | None) -> int:
    import torch
    from transformers.utils import logging as hf_logging

    from bench_scoring import baseline, group_texts, pair_texts
    from prblib.rewards.base import ModelSpec, PairInput, ScoreInput
    from prblib.llm.client import LocalCausalLMBackend
    from prblib.rewards.scalar import SELF_CHECK_TOLERANCE, ScalarRewardModel

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    if out:
        out.unlink(missing_ok=True)  # no earlier run's result left behind if this one stops early
    checks = Checks()
    if not torch.cuda.is_available():
        print("CUDA is not available on this machine", file=sys.stderr)
        return 2
    import transformers

    env = {"torch": torch.__version__, "transformers": transformers.__version__, "cuda": torch.version.cuda,
           "gpu": torch.cuda.get_device_name(0), "bf16_supported": torch.cuda.is_bf16_supported(),
           "gpu_memory_gib": round(torch.cuda.get_device_properties(0).total_memory / 2 ** 30, 1)}
    print(json.dumps(env), flush=True)
    data = json.loads((folder / "data.json").read_text())
    models = Path(tempfile.mkdtemp(prefix="cuda-check-"))
    build_models(models, folder / "tokenizer")
    pairs = [PairInput(id=p["id"], domain="bench", question=p["question"], profile=tuple(p["profile"]),
                       chosen=p["chosen"], rejected=p["rejected"]) for p in data["pairs"]]
    groups = [ScoreInput(id=g["id"], question=g["question"], profile=tuple(g["profile"]),
                         responses=tuple(g["responses"])) for g in data["groups"]]

    def load(path: Path, **spec) -> ScalarRewardModel:
        return ScalarRewardModel.load(ModelSpec(kind="scalar", path=str(path), max_length=4096, **spec))

    def pair_scores(rm: ScalarRewardModel) -> list[tuple[float, float]]:
        by_id = {r.id: r for r in rm.score_pairs(pairs, setting="profile")}
        return [(by_id[p.id].chosen_score, by_id[p.id].rejected_score) for p in pairs]

    def on_gpu(model) -> tuple[bool, list[str]]:
        off = [name for name, t in [*model.named_parameters(), *model.named_buffers()] if t.device.type != "cuda"]
        return not off, off[:3]

    def param_dtypes(model) -> list[str]:
        """Every floating-point parameter's dtype (buffers such as rotary frequencies may stay float32)."""
        return sorted({str(p.dtype).removeprefix("torch.") for p in model.parameters() if p.is_floating_point()})

    def agree(got: list[float], ref: list[float], tolerance: float) -> tuple[bool, float]:
        """(every score finite and |a - b| <= tolerance * (1 + |b|), the engine's own self-check
        rule; the largest |a - b|, NaN if any score is not finite)."""
        finite = all(map(math.isfinite, got)) and all(map(math.isfinite, ref))
        if not finite:
            return False, float("nan")
        within = all(abs(a - b) <= tolerance * (1 + abs(b)) for a, b in zip(got, ref, strict=True))
        return within, max(abs(a - b) for a, b in zip(got, ref, strict=True))

    half = "bfloat16" if env["bf16_supported"] else "float16"

    # CUDA's one-off allocations (cuBLAS workspaces per dtype) happen here, not inside a model's
    # load/close, where they would read as memory that close() failed to hand back.
    for dt in (torch.float32, torch.bfloat16, torch.float16):
        eye = torch.eye(64, device="cuda", dtype=dt)
        (eye @ eye).sum().item()

    # 1. scalar RMs in each dtype: against the plain full forward in the same dtype on the GPU
    # (what the engine guarantees: its prefix cache moves no score beyond SELF_CHECK_TOLERANCE,
    # by the engine's own rule), the same engine mode the CPU load chose, and against float32 on
    # the CPU (float32 must agree; half precision's own rounding is reported, not judged)
    for name in ("llama", "qwen", "bert"):
        with checks.section(f"scalar RM {name}"):
            cpu = load(models / name)
            reference = pair_scores(cpu)
            cpu_mode = cpu.engine.mode
            texts = pair_texts(cpu, pairs)
            cpu.close()
            for dtype in ("auto", "float16", "float32"):
                torch.cuda.synchronize()
                before = torch.cuda.memory_allocated()
                rm = load(models / name, device="cuda", dtype=dtype)
                placed, off = on_gpu(rm.model)
                dtypes = param_dtypes(rm.model)
                want = half if dtype == "auto" else dtype
                checks.check(f"{name} {dtype}: every parameter on the GPU in {want}", placed and dtypes == [want],
                             dtypes=dtypes, off_gpu=off)
                checks.check(f"{name} {dtype}: the engine keeps the CPU's mode ({cpu_mode})",
                             rm.engine.mode == cpu_mode, engine_mode=rm.engine.mode)
                start = time.perf_counter()
                scores = pair_scores(rm)
                seconds = time.perf_counter() - start
                flat = [s for pair in scores for s in pair]
                tolerance = SELF_CHECK_TOLERANCE[next(rm.model.parameters()).dtype]
                ok, diff = agree(flat, baseline(rm, texts), tolerance)
                checks.check(f"{name} {dtype}: engine against the plain forward on the GPU, same dtype",
                             ok, max_abs_diff=diff, tolerance=tolerance, seconds=seconds)
                ok, cpu_diff = agree(flat, [s for pair in reference for s in pair], 1e-3)
                same = statistics.mean((g[0] > g[1]) == (r[0] > r[1]) for g, r in zip(scores, reference))
                if dtype == "float32":
                    checks.check(f"{name} float32: against CPU float32", ok, max_abs_diff=cpu_diff,
                                 tolerance=1e-3, same_preference=same)
                else:
                    checks.check(f"{name} {dtype}: every score finite", all(map(math.isfinite, flat)))
                    checks.report(f"{name} {dtype}: against CPU float32", max_abs_diff=cpu_diff,
                                  same_preference=same)
                rm.close()
                torch.cuda.synchronize()
                left = torch.cuda.memory_allocated() - before
                checks.check(f"{name} {dtype}: close() frees the GPU memory", left <= MIB, left_bytes=left)

    # 2. Best-of-16 groups in half precision
    with checks.section("Best-of-16"):
        cpu = load(models / "llama")
        reference = dict(cpu.score_groups(groups, setting="profile"))
        cpu.close()
        rm = load(models / "llama", device="cuda")
        got = dict(rm.score_groups(groups, setting="profile"))
        flat = [s for g in groups for s in got[g.id]]
        tolerance = SELF_CHECK_TOLERANCE[next(rm.model.parameters()).dtype]
        ok, diff = agree(flat, baseline(rm, group_texts(rm, groups)), tolerance)
        checks.check(f"llama auto: Best-of-16 groups, engine ({rm.engine.mode}) against the plain forward on the GPU",
                     ok and rm.engine.mode == "prefix", max_abs_diff=diff, tolerance=tolerance,
                     engine_mode=rm.engine.mode)
        cpu_diff = max(abs(a - b) for g in groups for a, b in zip(got[g.id], reference[g.id], strict=True))
        best_same = statistics.mean(max(range(GROUP_SIZE), key=got[g.id].__getitem__)
                                    == max(range(GROUP_SIZE), key=reference[g.id].__getitem__) for g in groups)
        checks.report("llama auto: Best-of-16 groups against CPU float32", max_abs_diff=cpu_diff,
                      same_best_as_cpu=best_same)
        rm.close()

    # 3. speed on a ~130M-parameter Llama RM, bf16: engine against the plain full forward
    with checks.section("speed"):
        from transformers import AutoTokenizer, LlamaConfig, LlamaForSequenceClassification

        with tempfile.TemporaryDirectory() as tmp:
            big = Path(tmp) / "big"
            tokenizer = AutoTokenizer.from_pretrained(models / "llama", local_files_only=True)
            torch.manual_seed(SEED)
            config = LlamaConfig(vocab_size=len(tokenizer), **BIG, max_position_embeddings=4096, num_labels=1, pad_token_id=tokenizer.pad_token_id,
                                 bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
            LlamaForSequenceClassification(config).save_pretrained(big, safe_serialization=True)
            tokenizer.save_pretrained(big)
            rm = load(big, device="cuda", batch_size=8)
            params = sum(p.numel() for p in rm.model.parameters())
            texts = pair_texts(rm, pairs)
            list(rm.score_pairs(pairs[:4], setting="profile"))  # warm-up (kernels, allocator)
            baseline(rm, texts[:8])
            engine_s, base_s, engine_peak, base_peak = [], [], 0, 0
            for _ in range(3):
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                start = time.perf_counter()
                engine = [s for pair in pair_scores(rm) for s in pair]
                torch.cuda.synchronize()
                engine_s.append(time.perf_counter() - start)
                engine_peak = max(engine_peak, torch.cuda.max_memory_allocated())
                torch.cuda.reset_peak_memory_stats()
                start = time.perf_counter()
                plain = baseline(rm, texts)
                torch.cuda.synchronize()
                base_s.append(time.perf_counter() - start)
                base_peak = max(base_peak, torch.cuda.max_memory_allocated())
            ratios = [b / e for e, b in zip(engine_s, base_s)]
            tolerance = SELF_CHECK_TOLERANCE[next(rm.model.parameters()).dtype]
            ok, diff = agree(engine, plain, tolerance)
            checks.check(f"speed, {params / 1e6:.0f}M-parameter Llama RM, {half}, {len(texts)} responses: engine "
                         "vs plain full forward (the engine's time includes rendering the prompts; peak memory "
                         "includes the weights)", ok and rm.engine.mode == "prefix", engine_mode=rm.engine.mode,
                         engine_responses_per_s=len(texts) / min(engine_s),
                         plain_responses_per_s=len(texts) / min(base_s), speedup_min=min(ratios),
                         speedup_median=statistics.median(ratios), speedup_max=max(ratios),
                         engine_peak_mib=engine_peak / MIB, plain_peak_mib=base_peak / MIB, max_abs_diff=diff)
            rm.close()

    # 4. local generation
    with checks.section("local generation"):
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        backend = LocalCausalLMBackend(models / "lm", device="cuda")
        placed, off = on_gpu(backend.lm)
        dtypes = param_dtypes(backend.lm)
        checks.check(f"local LM (dtype auto): every parameter on the GPU in {half}", placed and dtypes == [half],
                     dtypes=dtypes, off_gpu=off)
        messages = [{"role": "user", "content": "Which answer fits this user best?"}]
        cpu_state, cuda_state = torch.get_rng_state(), torch.cuda.get_rng_state()
        first = [a.text for a in backend.complete(messages, temperature=0.8, max_tokens=24, seed=7, n=4)]
        again = [a.text for a in backend.complete(messages, temperature=0.8, max_tokens=24, seed=7, n=4)]
        other = [a.text for a in backend.complete(messages, temperature=0.8, max_tokens=24, seed=8, n=4)]
        greedy = [backend.complete(messages, temperature=0.0, max_tokens=24, seed=None)[0].text for _ in range(2)]
        untouched = torch.equal(cpu_state, torch.get_rng_state()) and torch.equal(cuda_state, torch.cuda.get_rng_state())
        checks.check("local LM: seeded sampling repeats, another seed differs, greedy repeats, caller's RNG untouched",
                     first == again and first != other and greedy[0] == greedy[1] and untouched,
                     same_seed_same=first == again, other_seed_differs=first != other,
                     greedy_repeats=greedy[0] == greedy[1], rng_untouched=untouched, sample=first[0][:60])
        backend.close()
        torch.cuda.synchronize()
        left = torch.cuda.memory_allocated() - before
        checks.check("local LM: close() frees the GPU memory", left <= MIB, left_bytes=left)

    judged = [r for r in checks.results if r["ok"] is not None]
    failed = [r["check"] for r in judged if not r["ok"]]
    summary = {"environment": env, "checks": checks.results, "failed": failed}
    if out:
        out.write_text(json.dumps(summary, indent=1))
    print(f"{len(judged) - len(failed)}/{len(judged)} checks passed; "
          f"{len(checks.results) - len(judged)} figures reported without a verdict")
    return 1 if failed else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="step", required=True)
    sub.add_parser("prepare", help="copy the tokenizer's files and write the data (CPU)").add_argument("folder", type=Path)
    run_parser = sub.add_parser("run", help="run the checks (GPU)")
    run_parser.add_argument("folder", type=Path)
    run_parser.add_argument("--out", type=Path, help="write every figure as JSON here")
    args = parser.parse_args()
    if args.step == "prepare":
        prepare(args.folder)
    else:
        sys.exit(run(args.folder, args.out))


if __name__ == "__main__":
    main()
