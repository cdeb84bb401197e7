"""The stages served: a repository of stage models (each network in a python-backend model)
and the BLS chain over them, the wheel's tritonserver on it, and the chain's figures."""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from perf.gpu_stages.chain import CRITICAL_PATH, turn_models
from perf.gpu_stages.networks import STAGES, TensorDef
from perf.gpu_stages.timing import summary

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
_TYPES = {"fp16": "TYPE_FP16", "fp32": "TYPE_FP32", "int64": "TYPE_INT64"}


def _tensor_config(kind: str, t: TensorDef, gpu: bool) -> str:
    dims = ", ".join(str(d) for d in (-1, *t.dims))
    dtype = t.dtype if gpu else t.dtype.replace("fp16", "fp32")  # a CPU runs FP32
    return f'{kind} [{{ name: "{t.name}" data_type: {_TYPES[dtype]} dims: [ {dims} ] }}]'


def _parameter(key: str, value: str) -> str:
    return (
        f"parameters {{ key: {json.dumps(key)} value: {{ string_value: {json.dumps(value)} }} }}\n"
    )


def _config(
    name: str, inputs: str, outputs: str, gpu: bool, extra: str = "", *, count: int = 1
) -> str:
    kind = "KIND_GPU" if gpu else "KIND_CPU"
    return (
        f'name: "{name}"\nbackend: "python"\nmax_batch_size: 0\n{inputs}\n{outputs}\n'
        f"instance_group [{{ count: {count} kind: {kind} }}]\n"
        # Inputs stay where the caller put them (GPU), not copied to the host first.
        + _parameter("FORCE_CPU_ONLY_INPUT_TENSORS", "no")
        + _parameter("repo_root", str(ROOT))
        + extra
    )


def write_repository(
    folder: Path, gpu: bool, instances: int = 1, models: Mapping[str, str] | None = None
) -> Path:
    """The stage models (`instances` of each, named as `models` names each stage's served
    model: turn_models()) and the BLS chain, written under `folder`."""
    models = dict(models or _repository_models())
    for stage in STAGES.values():
        name = models[stage.name]
        (folder / name / "1").mkdir(parents=True)
        shutil.copy(HERE / "stage_model.py", folder / name / "1" / "model.py")
        inputs = "\n".join(_tensor_config("input", t, gpu) for t in stage.inputs)
        outputs = "\n".join(_tensor_config("output", t, gpu) for t in stage.outputs)
        extra = _parameter("stage", stage.name)
        (folder / name / "config.pbtxt").write_text(
            _config(name, inputs, outputs, gpu, extra, count=instances)
        )
    (folder / "turn_chain" / "1").mkdir(parents=True)
    shutil.copy(HERE / "chain_model.py", folder / "turn_chain" / "1" / "model.py")
    (folder / "turn_chain" / "config.pbtxt").write_text(
        _config(
            "turn_chain",
            'input [{ name: "reps" data_type: TYPE_INT32 dims: [ 1 ] }]',
            'output [{ name: "timings" data_type: TYPE_UINT8 dims: [ -1 ] }]',
            gpu=False,
            extra=_parameter("device", "cuda" if gpu else "cpu")
            + _parameter("models", json.dumps(models)),
        )
    )
    return folder


def _repository_models() -> dict[str, str]:
    """turn_models(); where tritonclient (the config reader's protobuf) is not installed,
    as on a lent GPU machine given only torch and the server wheel, each stage is named as
    the default repository names its model (said in the log)."""
    try:
        return turn_models()
    except ImportError as error:
        log.warning("gpu-stages: the served models' names as the stages' (%s)", error)
        return {name: name for name in STAGES}


def c_order(torch, tensor):
    """`tensor` contiguous, with the strides the python backend's C-order check computes: an
    empty tensor (a KV cache of no tokens yet) gets 0 where torch keeps the size-1 strides."""
    tensor = tensor.contiguous()
    if tensor.numel():
        return tensor
    strides, step = [], 1
    for size in reversed(tensor.shape):
        strides.append(step)
        step *= size
    return torch.empty_strided(
        tensor.shape, tuple(reversed(strides)), dtype=tensor.dtype, device=tensor.device
    )


@contextlib.contextmanager
def serving(
    device_name: str, instances: int = 1, extra_args: tuple[str, ...] = ()
) -> Iterator[str]:
    """The wheel's tritonserver on a fresh stage repository; yields its HTTP URL."""
    from serving.server import EmbeddedServer, ServerOptions

    with tempfile.TemporaryDirectory(prefix="gpu-stages-") as tmp:
        repo = write_repository(Path(tmp) / "repository", device_name == "cuda", instances)
        options = ServerOptions(model_repository=repo, startup_timeout_s=600, extra_args=extra_args)
        with EmbeddedServer(options) as server:
            yield f"http://{server.http_url}"


def run_chain(url: str, reps: int, parameters: dict[str, Any] | None = None) -> dict[str, Any]:
    """One request to the BLS chain: `reps` turns (or, with `parameters`, the paced sessions
    of perf.gpu_stages.sessions); its JSON answer."""
    payload: dict[str, Any] = {
        "inputs": [{"name": "reps", "datatype": "INT32", "shape": [1], "data": [reps]}]
    }
    if parameters is not None:
        payload["parameters"] = {"sessions": json.dumps(parameters)}
    request = urllib.request.Request(
        f"{url}/v2/models/turn_chain/infer",
        data=json.dumps(payload).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=900) as response:
            answer = json.loads(response.read())
    except urllib.error.HTTPError as exc:
        raise RuntimeError(f"turn_chain failed: {exc.read().decode()[:2000]}") from exc
    return json.loads(bytes(answer["outputs"][0]["data"]).decode())


def model_stats(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"{url}/v2/models/stats", timeout=30) as r:
        return json.loads(r.read())


def served(device_name: str, reps: int) -> dict[str, Any]:
    """Start the wheel's tritonserver on the stage repository, run the BLS chain `reps` times."""
    with serving(device_name) as url:
        per_rep = run_chain(url, reps)
        stats = model_stats(url)
    result = {
        label: summary([rep[label] for rep in per_rep["reps"]]) for label in per_rep["reps"][0]
    }
    totals = [sum(rep[k] for k in CRITICAL_PATH) for rep in per_rep["reps"]]
    result["end_of_speech_to_first_audio"] = summary(totals)
    result["outputs_on_gpu"] = per_rep["outputs_on_gpu"]
    result["triton_compute_ms"] = {
        m["name"]: round(
            int(m["inference_stats"]["compute_infer"]["ns"])
            / max(1, int(m["inference_stats"]["compute_infer"]["count"]))
            / 1e6,
            3,
        )
        for m in stats["model_stats"]
        if int(m["inference_stats"]["compute_infer"]["count"])
    }
    return result
