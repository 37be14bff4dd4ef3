"""The dense retriever that picks a user's top-k past posts for a question.

Uses the real all-MiniLM-L6-v2 bundled in site-packages (nothing is downloaded) and tiny
random BERTs saved on the spot.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from prblib.errors import ModelError
from prblib.construction.retrieval import KNOWN_MODELS, DenseRetriever
from prblib.tiny_models import minilm_folder

QUESTION = "How do I keep my sourdough starter alive while I travel for two weeks?"
PROFILE_TEXTS = [
    "I feed my sourdough starter twice a day and keep it in the fridge when I am away from home.",
    "My rye sourdough starter smelled of acetone after I forgot to feed it for a week.",
    "Baked my first loaf of country bread this weekend; the crumb was dense but the crust was great.",
    "Does anyone know how long dried yeast keeps once the packet is opened?",
    "We spent two weeks travelling through Portugal by train and loved Porto.",
    "Kneading by hand versus with a stand mixer: which gives a better dough?",
    "The best pizza I ever made used a 72 hour cold ferment of the dough.",
    "My cat keeps knocking plants off the windowsill every night.",
    "Looking for advice on changing the brake pads of a 2012 Honda Civic.",
    "I have been learning to play the cello for three years now.",
    "What is a good beginner telescope for looking at Saturn's rings?",
    "Our team finally won the regional football tournament after extra time.",
    "Tips for growing tomatoes on a small balcony that gets afternoon sun?",
    "Can you recommend a fantasy novel with a well developed magic system?",
    "The stock market dipped sharply after the interest rate announcement.",
]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def minilm(one_torch_thread) -> DenseRetriever:
    return DenseRetriever.default()


@pytest.fixture(scope="module")
def raw_model():
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(minilm_folder(), local_files_only=True)
    model = AutoModel.from_pretrained(minilm_folder(), local_files_only=True, use_safetensors=True,
                                      dtype=torch.float32).eval()
    return tokenizer, model


def profile(texts=PROFILE_TEXTS) -> list[dict]:
    return [{"id": f"post-{i}", "text": text, "category": "Lifestyle"} for i, text in enumerate(texts)]


def brute_force_embedding(tokenizer, model, text: str, *, normalize: bool) -> torch.Tensor:
    """Each text tokenized and encoded on its own, mean-pooled by hand over its mask."""
    encoded = tokenizer(text, return_tensors="pt", truncation=True, max_length=512)
    with torch.no_grad():
        hidden = model(**encoded).last_hidden_state[0]
    mask = encoded["attention_mask"][0].to(torch.float32)
    vector = (hidden * mask[:, None]).sum(0) / mask.sum()
    return vector / vector.norm() if normalize else vector


def save_tiny_bert(folder: Path, *, seed: int = 0, hidden: int = 32) -> Path:
    from transformers import AutoTokenizer, BertConfig, BertModel

    tokenizer = AutoTokenizer.from_pretrained(minilm_folder(), local_files_only=True)
    config = BertConfig(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=hidden * 2,
                        num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=128,
                        pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(seed)
    model = BertModel(config).eval()
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    return folder


# --- ranking ---------------------------------------------------------------------------------

def test_rank_orders_posts_like_a_brute_force_encoding_of_each_text_alone(minilm, raw_model):
    tokenizer, model = raw_model
    posts = profile()
    q = brute_force_embedding(tokenizer, model, QUESTION, normalize=True)
    expected = [float(brute_force_embedding(tokenizer, model, p["text"], normalize=True) @ q) for p in posts]
    order = sorted(range(len(posts)), key=lambda i: -expected[i])
    gaps = np.diff(sorted(expected))
    assert gaps.min() > 1e-4, "the hand-made profile should have distinct relevance"

    ranked = minilm.rank(QUESTION, posts, k=10)

    assert [post["id"] for post, _ in ranked] == [posts[i]["id"] for i in order[:10]]
    assert [score for _, score in ranked] == pytest.approx([expected[i] for i in order[:10]], abs=1e-5)
    assert ranked[0][0]["id"] in {"post-0", "post-1"}  # the sourdough-starter posts are on topic


def test_a_text_embeds_the_same_alone_and_inside_a_padded_batch():
    retriever = DenseRetriever.default(lru_size=0)  # nothing cached between the calls
    short = "Sourdough starter."
    longer = [" ".join(PROFILE_TEXTS[:6]), " ".join(PROFILE_TEXTS)]

    alone = retriever.embed([short])[0]
    batched = retriever.embed([longer[0], short, longer[1]])[1]

    assert retriever.stats["embedded"] == 4
    np.testing.assert_allclose(batched, alone, atol=1e-5, rtol=0)


def test_batch_limits_change_the_batches_but_not_the_vectors(minilm):
    one_by_one = DenseRetriever.default(batch_size=1)
    token_capped = DenseRetriever.default(max_batch_tokens=64)

    expected = minilm.embed(PROFILE_TEXTS)

    np.testing.assert_allclose(one_by_one.embed(PROFILE_TEXTS), expected, atol=1e-5, rtol=0)
    np.testing.assert_allclose(token_capped.embed(PROFILE_TEXTS), expected, atol=1e-5, rtol=0)
    assert one_by_one.stats["batches"] == len(PROFILE_TEXTS)
    assert 1 < token_capped.stats["batches"] < len(PROFILE_TEXTS)


def test_ids_stay_attached_to_their_own_texts_after_ranking_a_shuffled_profile(minilm):
    original = {post["id"]: post["text"] for post in profile()}
    posts = profile()
    random.Random(7).shuffle(posts)

    ranked = minilm.rank(QUESTION, posts, k=len(posts))

    assert len(ranked) == len(posts)
    for post, _ in ranked:
        assert post["text"] == original[post["id"]]
        assert any(post is given for given in posts)  # the same dicts, not copies
    # Distinct scores: the ranking does not depend on the input order.
    assert [p["id"] for p, _ in ranked] == [p["id"] for p, _ in minilm.rank(QUESTION, profile(), k=None)]


def test_k_larger_than_the_profile_returns_every_post_once_and_an_empty_profile_returns_nothing(minilm):
    posts = profile(PROFILE_TEXTS[:4])

    ranked = minilm.rank(QUESTION, posts, k=10)

    assert sorted(post["id"] for post, _ in ranked) == sorted(post["id"] for post in posts)
    assert [s for _, s in ranked] == sorted((s for _, s in ranked), reverse=True)
    assert minilm.rank(QUESTION, [], k=10) == []


def test_repeated_texts_are_ranked_once_and_empty_posts_are_kept(minilm):
    posts = [{"id": "a", "text": "I keep my starter in the fridge."}, {"id": "b", "text": "Brake pads for a Honda."},
             {"id": "c", "text": "I keep my  starter in the fridge. "}, {"id": "d", "text": ""}]
    other = [{"id": "z", "text": "I keep my starter in the fridge"}, {"id": "y", "text": "I keep my starter in the fridge"}]

    ranked = minilm.rank(QUESTION, posts + [{"id": "e", "text": "Sourdough needs patience."}], k=None)

    ids = [post["id"] for post, _ in ranked]
    assert "c" not in ids and "d" in ids  # c repeats a's text; an empty post is still a post
    scores = {post["id"]: score for post, score in ranked}
    assert np.isfinite(scores["d"])
    assert [p["id"] for p, _ in minilm.rank(QUESTION, other, k=None)] == ["z"]


@pytest.mark.parametrize("posts, kept, removed", [
    ([{"id": "1", "text": "a"}, {"id": "1", "text": "b"}], ["1"], 1),  # same id, other text
    ([{"id": "1", "text": "a  b"}, {"id": "2", "text": " a b "}], ["1"], 1),  # same text, spacing aside
    ([{"id": "1", "text": "A b"}, {"id": "2", "text": "a b"}], ["1", "2"], 0),  # case differs: not identical
    ([{"text": "x"}, {"text": "y"}, {"id": None, "text": "z"}], [None, None, None], 0),  # no ids: text only
    ([], [], 0),
])
def test_repeated_posts_are_removed_by_id_and_by_identical_text(posts, kept, removed):
    from prblib.construction.retrieval import dedupe_posts

    unique, count = dedupe_posts(posts)
    assert [p.get("id") for p in unique] == kept and count == removed


def test_rank_many_gives_the_same_rankings_as_rank_and_reports_progress(minilm):
    rng = random.Random(3)
    items = []
    for u in range(5):
        texts = rng.sample(PROFILE_TEXTS, rng.randint(0, 8))
        items.append((rng.choice(PROFILE_TEXTS), profile(texts)))
    done = []

    many = minilm.rank_many(items, k=3, progress=done.append)

    assert sum(done) == len(items)
    for (question, posts), got in zip(items, many):
        one = minilm.rank(question, posts, k=3)
        assert [p["id"] for p, _ in got] == [p["id"] for p, _ in one]
        assert [s for _, s in got] == pytest.approx([s for _, s in one], abs=1e-6)


# --- cache -----------------------------------------------------------------------------------

def test_a_second_call_embeds_no_new_texts_and_returns_identical_vectors(tmp_path):
    retriever = DenseRetriever.default(cache_dir=tmp_path / "cache")
    first = retriever.embed(PROFILE_TEXTS)
    assert retriever.stats["embedded"] == len(PROFILE_TEXTS)

    second = retriever.embed(PROFILE_TEXTS)

    assert retriever.stats["embedded"] == len(PROFILE_TEXTS)  # nothing new
    assert retriever.stats["memory_hits"] == len(PROFILE_TEXTS)
    np.testing.assert_array_equal(first, second)

    # A new process (a new instance) reads the vectors back from disk.
    again = DenseRetriever.default(cache_dir=tmp_path / "cache")
    third = again.embed(PROFILE_TEXTS)
    assert again.stats["embedded"] == 0 and again.stats["disk_hits"] == len(PROFILE_TEXTS)
    np.testing.assert_array_equal(first, third)

    # A damaged entry is recomputed, not trusted.
    victim = next((tmp_path / "cache").rglob("*.npy"))
    victim.write_bytes(b"not a numpy file")
    fresh = DenseRetriever.default(cache_dir=tmp_path / "cache")
    # (equal to float noise only: it is recomputed alone, not in its first batch's padding)
    np.testing.assert_allclose(fresh.embed(PROFILE_TEXTS), first, atol=1e-5, rtol=0)
    assert fresh.stats["embedded"] == 1 and fresh.stats["disk_hits"] == len(PROFILE_TEXTS) - 1
    assert not list((tmp_path / "cache").rglob(".tmp-*"))


def test_the_disk_cache_separates_normalised_from_raw_vectors(tmp_path):
    normed = DenseRetriever.default(cache_dir=tmp_path)
    normed.embed(PROFILE_TEXTS[:3])
    raw = DenseRetriever.default(cache_dir=tmp_path, normalize=False)

    vectors = raw.embed(PROFILE_TEXTS[:3])

    assert raw.stats["embedded"] == 3
    assert np.linalg.norm(vectors, axis=1).min() > 1.5


# --- normalisation ---------------------------------------------------------------------------

def test_normalisation_turns_dot_products_into_cosines(minilm):
    raw = DenseRetriever.default(normalize=False)
    assert minilm.normalize is True and raw.normalize is False
    assert KNOWN_MODELS["facebook/contriever-msmarco"]["normalize"] is False

    q_raw, p_raw = raw.embed([QUESTION])[0], raw.embed(PROFILE_TEXTS)
    np.testing.assert_allclose(np.linalg.norm(minilm.embed(PROFILE_TEXTS), axis=1), 1.0, atol=1e-5)
    raw_scores = [s for _, s in raw.rank(QUESTION, profile(), k=None)]
    cos_scores = {p["id"]: s for p, s in minilm.rank(QUESTION, profile(), k=None)}

    expected_raw = p_raw @ q_raw
    expected_cos = expected_raw / (np.linalg.norm(p_raw, axis=1) * np.linalg.norm(q_raw))
    assert raw_scores == pytest.approx(sorted(expected_raw, reverse=True), rel=1e-5)
    assert [cos_scores[f"post-{i}"] for i in range(len(PROFILE_TEXTS))] == pytest.approx(expected_cos, abs=1e-5)
    assert max(raw_scores) > 1.5  # raw MiniLM vectors are far from unit length


# --- loading ---------------------------------------------------------------------------------

def test_a_tiny_random_bert_saved_as_safetensors_loads_through_from_name(tmp_path):
    folder = save_tiny_bert(tmp_path / "tiny")

    retriever = DenseRetriever.from_name(str(folder))

    assert retriever.normalize is False  # unknown model, no Normalize module: contriever's raw dot product
    vectors = retriever.embed(["hello world", ""])
    assert vectors.shape == (2, 32) and vectors.dtype == np.float32
    assert retriever.max_length == 128  # capped by the model's positions
    assert [p["id"] for p, _ in retriever.rank("hello", profile(PROFILE_TEXTS[:3]), k=2)]


def test_contriever_missing_from_an_empty_hf_cache_raises_a_clear_model_error(monkeypatch, tmp_path):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))

    with pytest.raises(ModelError) as error:
        DenseRetriever.from_name("facebook/contriever-msmarco")

    message = str(error.value)
    assert "facebook/contriever-msmarco is not on this machine" in message
    assert "download it once into" in message and "pass the folder" in message
    assert str(tmp_path) in message


def test_contriever_found_in_the_local_hf_cache_uses_the_raw_dot_product(monkeypatch, tmp_path):
    import huggingface_hub.constants

    repo = tmp_path / "models--facebook--contriever-msmarco"
    save_tiny_bert(repo / "snapshots" / ("a" * 40))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("a" * 40)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))

    retriever = DenseRetriever.from_name("facebook/contriever-msmarco")

    assert retriever.name == "facebook/contriever-msmarco"
    assert retriever.normalize is False
    assert DenseRetriever.from_name("facebook/contriever-msmarco", normalize=True).normalize is True


def test_folders_with_pickle_weights_or_remote_code_are_refused(tmp_path):
    pickled = save_tiny_bert(tmp_path / "pickled")
    (pickled / "model.safetensors").rename(pickled / "pytorch_model.bin")
    with pytest.raises(ModelError, match="pickle-only weights refused"):
        DenseRetriever.from_name(pickled)

    remote = save_tiny_bert(tmp_path / "remote")
    config = json.loads((remote / "config.json").read_text())
    config["auto_map"] = {"AutoModel": "modeling_evil.EvilModel"}
    (remote / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelError, match="remote code"):
        DenseRetriever.from_name(remote)

    with pytest.raises(ModelError, match="does not exist"):
        DenseRetriever.from_name(tmp_path / "nowhere")


# --- pooling from the folder's sentence-transformers config -------------------------------------

def declare_pooling(folder: Path, **modes: bool) -> Path:
    (folder / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]))
    (folder / "1_Pooling").mkdir(exist_ok=True)
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": 32, **modes}))
    return folder


def test_last_token_pooling_is_read_from_the_folder_and_takes_each_texts_last_real_token(tmp_path):
    folder = declare_pooling(save_tiny_bert(tmp_path / "enc"), pooling_mode_lasttoken=True)
    retriever = DenseRetriever(folder, normalize=False, lru_size=0)
    assert retriever.pooling == "lasttoken"
    texts = ["Sourdough starter.", " ".join(PROFILE_TEXTS[:3])]
    batched = retriever.embed(texts)  # padded together: the short text's last token is not the batch's last
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModel.from_pretrained(folder).eval()
    for text, got in zip(texts, batched):
        ids = tokenizer(text, return_tensors="pt")
        with torch.no_grad():
            expected = model(**ids).last_hidden_state[0, -1]
        np.testing.assert_allclose(got, expected.numpy(), atol=1e-5, rtol=0)
    assert DenseRetriever(declare_pooling(folder, pooling_mode_mean_tokens=True), lru_size=0).pooling == "mean"


def test_a_pooling_we_do_not_implement_is_refused(tmp_path):
    from prblib.errors import ModelError

    folder = declare_pooling(save_tiny_bert(tmp_path / "enc"), pooling_mode_max_tokens=True)
    with pytest.raises(ModelError, match="pooling_mode_max_tokens.*not supported"):
        DenseRetriever(folder)
