"""`perf gpu-stages` (run on a lent GPU): its networks, Triton tensors and chain, on a CPU."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from perf import gpu_stages  # noqa: E402


# `extended` (18 s: the GPU benchmark's full-size networks on two CPU cores): a benchmark's
# smoke run. CI checks its Triton tensors against the configs
# (test_repository_configs_name_every_stage_tensor); the benchmark itself runs on a lent GPU.
@pytest.mark.extended
def test_the_chain_runs_and_every_output_matches_its_triton_tensor():
    device = torch.device("cpu")
    torch.manual_seed(0)
    forwards = {name: stage.build(torch, device) for name, stage in gpu_stages.STAGES.items()}
    seen = set()

    def call(model, inputs):
        stage = gpu_stages.STAGES[model]
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

    ms = gpu_stages.chain_once(torch, device, call)
    assert seen == set(gpu_stages.STAGES)
    assert set(gpu_stages.CRITICAL_PATH) <= set(ms)


def test_repository_configs_name_every_stage_tensor(tmp_path):
    repo = gpu_stages.write_repository(tmp_path / "repo", gpu=True)
    for name, stage in gpu_stages.STAGES.items():
        config = (repo / name / "config.pbtxt").read_text()
        assert 'string_value: "no"' in config  # inputs stay on the GPU
        assert "KIND_GPU" in config
        for spec in (*stage.inputs, *stage.outputs):
            assert f'name: "{spec.name}"' in config
    assert "KIND_CPU" in (repo / "turn_chain" / "config.pbtxt").read_text()


def test_an_empty_cache_gets_the_strides_the_backend_checks():
    empty = torch.zeros(1, 12, 8, 0, 64)
    assert empty.stride() != (0, 0, 0, 64, 1)
    assert gpu_stages.c_order(torch, empty).stride() == (0, 0, 0, 64, 1)
    full = torch.zeros(2, 3).T
    assert gpu_stages.c_order(torch, full).is_contiguous()
