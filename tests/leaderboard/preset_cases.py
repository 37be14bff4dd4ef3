"""Each model preset's family in miniature, for the end-to-end tests: a tiny model of its architecture
(scalar presets) or a fake endpoint answering in the family's own format (judges, P-GenRM), on a
12-pair benchmark whose expected accuracies are fixed by hand below.

The benchmark: pairs q0..q11, four per LaMP-QA domain (q0-q3 arts, q4-q7 lifestyle, q8-q11 society);
each chosen answer carries the marker CHOSEN-i, each rejected one REJECTED-i, so a fake judge can find
them wherever the prompt puts them. The fake judges prefer the chosen answer except on WRONG pairs
(they prefer the rejected one) and answer something unreadable on UNREAD pairs (a parse failure: the
pair is wrong). Hence, by hand: arts 3/4 (q3 wrong), lifestyle 2/4 (q6, q7 wrong), society 3/4 (q10
unread), all pairs 8/12.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch

from prblib.tiny_models import CHAT_TEMPLATE, load_tokenizer
from tests.pipeline.test_formats import make_row, write_jsonl

WRONG = {3, 6, 7}
UNREAD = {10}
CATEGORIES = ["Art_and_Entertainment"] * 4 + ["Lifestyle_and_Personal_Development"] * 4 + ["Society_and_Culture"] * 4
JUDGE_EXPECTED = {"arts_entertainment": 3 / 4, "lifestyle_personal_development": 2 / 4,
                  "society_culture": 3 / 4, "all": 8 / 12}
MARK = re.compile(r"(CHOSEN|REJECTED)-(\d+)")


def benchmark_file(folder: Path) -> Path:
    rows = [make_row(i, id=f"q{i}", category=CATEGORIES[i],
                     chosen=f"CHOSEN-{i}: practise wet-on-wet washes with watercolour, step {i}.",
                     rejected=f"REJECTED-{i}: practise painting regularly.") for i in range(12)]
    return write_jsonl(folder / "presets.jsonl", rows)


def _user_text(body: dict) -> str:
    return "\n".join(m["content"] for m in body["messages"] if isinstance(m.get("content"), str))


def _pair(body: dict) -> tuple[int, bool | None]:
    """(pair index, whether the chosen answer comes first; None when only one answer is shown)."""
    text = _user_text(body)
    found = MARK.findall(text)
    index = int(found[0][1])
    kinds = [k for k, _ in found]
    if "CHOSEN" in kinds and "REJECTED" in kinds:
        return index, text.index("CHOSEN-") < text.index("REJECTED-")
    return index, None


def _letter(body: dict) -> tuple[int, str]:
    """(pair index, the letter of the answer this fake judge prefers)."""
    index, chosen_first = _pair(body)
    prefers_chosen = index not in WRONG
    return index, "A" if prefers_chosen == chosen_first else "B"


def rm_r1_instruct(body: dict) -> str:
    index, letter = _letter(body)
    if index in UNREAD:
        return "<type>Chat</type><rubric>fit</rubric><eval>Both are fine.</eval>"
    return (f"<type>Chat</type>\n<rubric>1. Fits a watercolour painter.</rubric>\n<eval>Answer {letter} fits "
            f"better.</eval>\n<answer>[[{letter}]]</answer>")


def rm_r1_distilled(body: dict) -> str:
    index, letter = _letter(body)
    decoy = "B" if letter == "A" else "A"
    if index in UNREAD:
        return f"<think>Maybe [[{decoy}]]...</think>\nI am not sure."
    # The thinking names the other letter: only the answer block after it counts.
    return f"<think>At first <answer>[[{decoy}]]</answer> seemed right, but no.</think>\n<answer>[[{letter}]]</answer>"


def r3_pairwise(body: dict) -> str:
    index, letter = _letter(body)
    if index in UNREAD:
        return '{"explanation": "Both are reasonable.", "score": "tie"}'
    score = {0: f"Response {letter}", 1: f"Assistant {letter}", 2: "Response " + ("1" if letter == "A" else "2")}
    return ("<think>Compare them.</think>\n" +
            json.dumps({"explanation": f"{letter} fits the painter.", "score": score[index % 3]}))


def r3_pointwise(body: dict) -> str:
    index, _ = _pair(body)
    is_chosen = "CHOSEN-" in _user_text(body)
    if index in UNREAD and is_chosen:
        return '{"explanation": "Hard to say.", "score": "n/a"}'
    good = (index not in WRONG) == is_chosen
    return json.dumps({"explanation": "Rated by the rubric.", "score": 4 if good else 2})


def r3_binary(body: dict) -> str:
    index, _ = _pair(body)
    is_chosen = "CHOSEN-" in _user_text(body)
    if index in UNREAD and is_chosen:
        return '```json\n{"explanation": "Unclear.", "score": "maybe"}\n```'
    good = (index not in WRONG) == is_chosen
    return "<think>Decide.</think>" + json.dumps({"explanation": "By the rubric.", "score": good})


def hosted(body: dict) -> str:
    index, letter = _letter(body)
    return "I would rather not pick." if index in UNREAD else f"Answer {letter} fits the person.\nVerdict: {letter}"


def p_genrm_published(body: dict) -> str:
    from prblib.rewards.pgenrm.published import END, START

    index, letter = _letter(body)
    if index in UNREAD:
        return "An analysis with no verdict."
    r1, r2 = (8.5, 3.0) if letter == "A" else (3.0, 8.5)
    obj = {"rationale": "Fit 70%, quality 30%.", "better_response": {"response_1": r1, "response_2": r2}}
    return f"The user paints in watercolour.\n{START}\n{json.dumps(obj)}\n{END}"


# preset name -> (responder for the fake endpoint, or None for a local folder; extra options; expected accuracies)
JUDGE_CASES = {
    "rm-r1-instruct": rm_r1_instruct,
    "rm-r1-distilled": rm_r1_distilled,
    "r3-pairwise": r3_pairwise,
    "r3-pointwise": r3_pointwise,
    "r3-binary": r3_binary,
    "openai-compatible-judge": hosted,
    "p-genrm-released": p_genrm_published,
}
# Explicit options win over the preset's: two P-GenRM chains instead of the paper's 16 keep the test fast.
EXTRA_OPTIONS = {"p-genrm-released": {"m": 2}}
SCALAR_CASES = {"skywork-reward-v2-llama": "llama", "skywork-reward-v2-qwen3": "qwen3", "internlm2-reward": "llama"}


def responder(body: dict) -> str:
    """One fake endpoint for every judge preset: the model name in the request says which family answers."""
    return JUDGE_CASES[body["model"]](body)


def build_scalar(folder: Path, arch: str, seed: int = 0) -> Path:
    """A tiny sequence classifier of the preset's architecture (LlamaForSequenceClassification, or
    Qwen3ForSequenceClassification as Skywork-Reward-V2-Qwen3) with one logit, saved as safetensors."""
    from transformers import AutoModelForSequenceClassification, LlamaConfig, Qwen3Config

    tokenizer = load_tokenizer(chat_template=CHAT_TEMPLATE)
    tokenizer.model_max_length = 2048
    common = dict(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048, num_labels=1,
                  pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
                  eos_token_id=tokenizer.eos_token_id, initializer_range=0.1, tie_word_embeddings=False)
    config = Qwen3Config(head_dim=16, **common) if arch == "qwen3" else LlamaConfig(**common)
    torch.manual_seed(seed)
    model = AutoModelForSequenceClassification.from_config(config, dtype=torch.float32).eval()
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    return folder


def reference_scalar_scores(folder: Path, question_answer: list[tuple[str, str, str]]) -> dict[str, float]:
    """{pair id: chosen minus rejected score} by a plain forward: the question as the user turn and
    the answer as the assistant turn through the folder's chat template, the single logit read at
    the last token (transformers' own pooling for decoder classifiers)."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    model = AutoModelForSequenceClassification.from_pretrained(folder, dtype=torch.float32).eval()
    out = {}
    with torch.no_grad():
        for pair_id, question, answers in question_answer:
            scores = []
            for answer in answers:
                text = tokenizer.apply_chat_template([{"role": "user", "content": question},
                                                      {"role": "assistant", "content": answer}], tokenize=False)
                ids = tokenizer(text, return_tensors="pt", add_special_tokens=False)
                scores.append(float(model(**ids).logits[0, 0]))
            out[pair_id] = scores[0] - scores[1]
    return out
