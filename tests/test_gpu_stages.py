"""`perf gpu-stages` (run on a lent GPU): its networks, Triton tensors and chain, on a CPU."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from perf.gpu_stages import chain, served  # noqa: E402
from perf.gpu_stages.networks import STAGES  # noqa: E402


# `extended` (18 s: the GPU benchmark's full-size networks on two CPU cores): a benchmark's
# smoke run. CI checks its Triton tensors against the configs
# (test_repository_configs_name_every_stage_tensor); the benchmark itself runs on a lent GPU.
@pytest.mark.extended
def test_the_chain_runs_and_every_output_matches_its_triton_tensor():
    device = torch.device("cpu")
    torch.manual_seed(0)
    forwards = {name: stage.build(torch, device) for name, stage in STAGES.items()}
    seen = set()

    def call(model, inputs):
        stage = STAGES[model]
        assert sorted(inputs) == sorted(t.name for t in stage.inputs)
        for spec in stage.inputs:
            assert inputs[spec.name].dim() == len(spec.dims) + 1, (model, spec.name)
        with torch.inference_mode():
            outputs = forwards[model](**inputs)
        assert len(outputs) == len(stage.outputs), model
        for spec, value in zip(stage.outputs, outputs, strict=True):
            assert value.dim() == len(spec.dims) + 1, (model, spec.name, value.shape)
            fixed = [(d, n) for d, n in zip(spec.dims, value.shape[1:], strict=True) if d != -1]
            assert all(d == n for d, n in fixed), (model, spec.name, value.shape)
            assert torch.isfinite(value.float()).all(), (model, spec.name)
        seen.add(model)
        return {spec.name: v for spec, v in zip(stage.outputs, outputs, strict=True)}

    ms = chain.chain_once(torch, device, call)
    assert seen == set(STAGES)
    assert set(chain.CRITICAL_PATH) <= set(ms)


def test_repository_configs_name_every_stage_tensor(tmp_path):
    repo = served.write_repository(tmp_path / "repo", gpu=True)
    for name, stage in STAGES.items():
        config = (repo / name / "config.pbtxt").read_text()
        assert 'string_value: "no"' in config  # inputs stay on the GPU
        assert "KIND_GPU" in config
        for spec in (*stage.inputs, *stage.outputs):
            assert f'name: "{spec.name}"' in config
    assert "KIND_CPU" in (repo / "turn_chain" / "config.pbtxt").read_text()


def test_an_empty_cache_gets_the_strides_the_backend_checks():
    empty = torch.zeros(1, 12, 8, 0, 64)
    assert empty.stride() != (0, 0, 0, 64, 1)
    assert served.c_order(torch, empty).stride() == (0, 0, 0, 64, 1)
    full = torch.zeros(2, 3).T
    assert served.c_order(torch, full).is_contiguous()


def test_the_chain_stands_for_the_models_the_repository_configs_call(tmp_path):
    from model_configs.pbtxt import call_graph

    models = chain.turn_models()
    assert sorted(models) == sorted(STAGES) and sorted(models.values()) == sorted(STAGES)
    graph = call_graph(root="avatar")
    networks = {m for calls in graph.values() for m in calls.values() if m not in graph}
    # every network the avatar's chain reaches is a stage here, but the renderers (frames
    # come after the first audio)
    assert networks - set(models.values()) == {"renderer", "portrait_renderer"}
    repo = served.write_repository(tmp_path / "repo", gpu=False, models=models)
    assert json.dumps(json.dumps(models)) in (repo / "turn_chain" / "config.pbtxt").read_text()


def test_the_networks_have_the_served_models_shapes():
    from avatar.model_io import ASR_ENCODER, EMOTION_ENCODER, LLM_DECODER
    from perf.gpu_stages.networks import config

    whisper, llm, minilm = config("whisper_base"), config("smollm2"), config("minilm")
    kv_dims = ASR_ENCODER.outputs["cross_kv"].spec.dims
    heads = whisper["encoder_attention_heads"]
    assert kv_dims == (2 * whisper["decoder_layers"], heads, -1, whisper["d_model"] // heads)
    assert LLM_DECODER.outputs["logits"].spec.dims[-1] == llm["vocab_size"]
    assert EMOTION_ENCODER.outputs["embedding"].spec.dims == (minilm["hidden_size"],)
    from avatar.animation.emotion_classifier import model_dir

    packaged = json.loads((model_dir() / "config.json").read_text())
    assert {k: packaged[k] for k in minilm} == minilm


# `extended`: reading the GGUF's metadata takes ~8 s on two cores
@pytest.mark.extended
def test_the_llm_network_is_the_packaged_smollm2():
    from transformers import AutoConfig

    from export.llm.convert import packaged_smollm2
    from perf.gpu_stages.networks import config

    checkpoint = packaged_smollm2()
    packaged = AutoConfig.from_pretrained(checkpoint.folder, gguf_file=checkpoint.gguf_file)
    for key, value in config("smollm2").items():
        assert getattr(packaged, key) == pytest.approx(value, rel=1e-6), key
