"""The export path on tiny random-initialised Llama and Qwen2 checkpoints (seconds): the
ONNX decoder step matches PyTorch within tolerance, greedy tokens are equal at batch 1
and in a left-padded batch, the first step has an empty past, and the checkpoint round
trip keeps the rope theta."""

from __future__ import annotations

import numpy as np
import pytest

from avatar.llm.decoder import OrtDecoder, greedy
from export.common import describe_onnx
from export.llm import convert, decoder_onnx, verify

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def tiny_model(kind: str):
    torch.manual_seed(0)
    common = dict(
        vocab_size=300,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        rope_theta=100000.0,
        attn_implementation="eager",
    )
    if kind == "llama":
        return transformers.LlamaForCausalLM(transformers.LlamaConfig(**common)).eval()
    return transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**common)).eval()


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def exported(request, tmp_path_factory):
    model = tiny_model(request.param)
    path = tmp_path_factory.mktemp(request.param) / "model.onnx"
    dims = decoder_onnx.export_decoder(model, path)
    return model, dims, path


def test_names_dtypes_and_dynamic_axes(exported):
    _, dims, path = exported
    inputs, outputs = describe_onnx(path)
    names = [t.name for t in inputs]
    assert names[:3] == ["input_ids", "attention_mask", "position_ids"]
    assert names[3:] == dims.layout.past_names()
    assert [t.name for t in outputs] == ["logits", *dims.layout.present_names()]
    assert inputs[3].shape == ("batch", dims.kv_heads, "past_sequence", dims.head_dim)
    assert outputs[0].shape == ("batch", "sequence", dims.vocab)
    assert all(t.shape[0] == "batch" for t in inputs + outputs)
    assert inputs[0].dtype == "int64" and outputs[1].dtype == "float32"


def test_step_matches_pytorch_with_and_without_past(exported):
    model, dims, path = exported
    record = verify.compare_step(
        verify.TorchDecoder(model, dims.layout), OrtDecoder(path), dims.vocab, seed=3
    )
    assert record["logits_max_abs"] <= verify.LOGIT_TOLERANCE.atol


def test_greedy_tokens_equal_pytorch_batch1_and_left_padded(exported):
    model, dims, path = exported
    rng = np.random.default_rng(5)
    prompts = [rng.integers(3, dims.vocab, n).tolist() for n in (3, 9, 5, 12, 1, 7)]
    reference, candidate = verify.TorchDecoder(model, dims.layout), OrtDecoder(path)
    record = verify.check_tokens(reference, candidate, prompts, 12, pad=0, batch=3)
    assert record["batch1"]["exact"] == len(prompts)
    alone = [greedy(candidate, [p], 12)[0] for p in prompts]
    assert greedy(candidate, prompts, 12) == alone  # rows do not depend on each other


def test_token_mismatch_is_a_typed_error(exported):
    _, dims, path = exported
    other = tiny_model("llama")
    with torch.no_grad():
        for p in other.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    prompts = [[5, 6, 7], [8, 9]]
    with pytest.raises(verify.TokenMismatchError):
        verify.check_tokens(
            verify.TorchDecoder(other, dims.layout), OrtDecoder(path), prompts, 8, pad=0
        )


def test_checkpoint_round_trip_keeps_rope_theta(tmp_path):
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    model = tiny_model("llama")
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel({"a": 0})))
    folder = convert.save_checkpoint(model, tokenizer, tmp_path / "ckpt")
    checkpoint = convert.checkpoint_from_path(folder)
    reloaded, _ = convert.load_checkpoint(
        convert.Checkpoint(checkpoint.folder, expected_rope_theta=100000.0)
    )
    assert reloaded.config.rope_theta == 100000.0
    with pytest.raises(convert.CheckpointError, match="rope_theta is 100000"):
        convert.check_config(reloaded.config, 10000.0)
    reloaded.config.model_type = "gpt2"
    with pytest.raises(convert.CheckpointError, match="not a supported decoder"):
        convert.check_config(reloaded.config, None)
    with pytest.raises(convert.CheckpointError, match=r"expected a \.gguf"):
        convert.checkpoint_from_path(tmp_path)
