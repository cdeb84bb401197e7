"""The production path's stages on a GPU: each network in PyTorch CUDA inside a python-backend
model of the wheel's tritonserver, the turn's critical path chained by a BLS model whose
tensors stay in GPU memory (DLPack both ways, no host copy).

    python -m perf gpu-stages                     # needs torch with CUDA
    python -m perf.gpu_stages --device cpu --reps 2   # the same code path on a CPU (a check)
    python -m perf gpu-stages --sessions 1 2 4 8 16 32 64   # sessions per GPU (perf.gpu_capacity)

Prints, per stage: the network alone (CUDA events, batch 1 and 8) and the same network as a
Triton model called from BLS (request + DLPack + response), median and p95, and the sum of
the stages that lie between the end of speech and the first audio.

The networks are the served ones' architectures and shapes, in FP16 as the TensorRT engines
run: Whisper base's encoder and decoder step (`export.asr.modules`, the exported graph's own
code), SmolLM2-135M (30 layers, 576 wide, grouped-query attention 9/3), all-MiniLM-L6-v2,
Smart Turn (a Whisper-tiny encoder on 8 s) and a Piper-medium-sized VITS; lipsync carries its
committed weights. The others are randomly initialised: their weights (hundreds of MB) do
not travel to a lent GPU machine, and a kernel's time depends on the shapes, not the values.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import math
import shutil
import statistics
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "build/perf/gpu_stages/stages.json"

# The turn's shapes (the served ones): a question of ~4 s in a 10-s ASR window, a
# 24-token transcript, a 320-token prompt (persona + knowledge + history), a first clause
# of 12 tokens, a 24-token sentence for emotion, 60 phonemes of TTS, 1.5 s of lipsync audio.
ASR_FRAMES = 1000
TURN_FRAMES = 800
TRANSCRIPT_TOKENS = 24
PROMPT_TOKENS = 320
CLAUSE_TOKENS = 12
EMOTION_TOKENS = 24
PHONEMES = 60
LIPSYNC_SAMPLES = 24_000
PHONEMES_PER_S = 14.0


@dataclasses.dataclass(frozen=True)
class TensorDef:
    name: str
    dtype: str  # "fp16" | "int64" | "fp32"
    dims: tuple[int, ...]  # without the batch axis; -1 = variable


@dataclasses.dataclass
class Stage:
    """One network: how to build it, an example request, its Triton tensors."""

    name: str
    build: Callable[[Any, Any], Callable[..., tuple]]  # (torch, device) -> forward
    example: Callable[[Any, Any, int], dict[str, Any]]  # (torch, device, batch) -> inputs
    inputs: tuple[TensorDef, ...]
    outputs: tuple[TensorDef, ...]


# --- the networks --------------------------------------------------------------------------


def _whisper(size: str, **overrides: int):
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    dims = {"base": (512, 6, 8, 2048), "tiny": (384, 4, 6, 1536)}[size]
    d, layers, heads, ffn = dims
    config = WhisperConfig(
        d_model=d,
        encoder_layers=layers,
        decoder_layers=layers,
        encoder_attention_heads=heads,
        decoder_attention_heads=heads,
        encoder_ffn_dim=ffn,
        decoder_ffn_dim=ffn,
        vocab_size=51865,
        num_mel_bins=80,
        **overrides,
    )
    return WhisperForConditionalGeneration(config).eval()


def _float(torch, device):
    """The networks' float type: FP16 on a GPU (as the TensorRT engines run), FP32 else."""
    return torch.float16 if device.type == "cuda" else torch.float32


def _half(torch, module, device):
    return module.to(device=device, dtype=_float(torch, device)).eval()


def _asr_encoder(torch, device):
    from export.asr.modules import WhisperEncoderExport

    net = _half(torch, WhisperEncoderExport(_whisper("base")), device)
    return lambda mel: net(mel)[1:]


def _asr_decoder(torch, device):
    from export.asr.modules import WhisperDecoderExport

    return _half(torch, WhisperDecoderExport(_whisper("base")), device)


def _turn_detector(torch, device):
    # Smart Turn: a Whisper-tiny encoder over 8 s, its states pooled, one logit, a sigmoid
    whisper = _whisper("tiny", max_source_positions=TURN_FRAMES // 2)
    encoder = _half(torch, whisper.model.encoder, device)
    head = _half(torch, torch.nn.Linear(384, 1), device)

    def forward(mel):
        hidden = encoder(mel).last_hidden_state
        return (torch.sigmoid(head(hidden.mean(dim=1))),)

    return forward


class _LlamaStep:
    """SmolLM2-135M's decoder step with an explicit KV cache [B, 2L, kv heads, P, Dh]."""

    LAYERS, WIDTH, HEADS, KV_HEADS, FFN, VOCAB = 30, 576, 9, 3, 1536, 49152

    def __init__(self, torch, device):
        nn = torch.nn
        self.torch = torch
        dh = self.WIDTH // self.HEADS
        self.dh = dh
        layers = []
        for _ in range(self.LAYERS):
            layers.append(
                nn.ModuleDict(
                    {
                        "q": nn.Linear(self.WIDTH, self.WIDTH, bias=False),
                        "kv": nn.Linear(self.WIDTH, 2 * self.KV_HEADS * dh, bias=False),
                        "o": nn.Linear(self.WIDTH, self.WIDTH, bias=False),
                        "up": nn.Linear(self.WIDTH, 2 * self.FFN, bias=False),
                        "down": nn.Linear(self.FFN, self.WIDTH, bias=False),
                        "n1": nn.RMSNorm(self.WIDTH),
                        "n2": nn.RMSNorm(self.WIDTH),
                    }
                )
            )
        body = nn.ModuleDict(
            {
                "embed": nn.Embedding(self.VOCAB, self.WIDTH),
                "layers": nn.ModuleList(layers),
                "norm": nn.RMSNorm(self.WIDTH),
            }
        )
        self.net = _half(torch, body, device)
        inv = 1.0 / (100000.0 ** (torch.arange(0, dh, 2, device=device).float() / dh))
        self.inv_freq = inv

    def _rope(self, x, positions):
        torch = self.torch
        angles = positions[:, None].float() * self.inv_freq[None, :]  # [S, Dh/2]
        cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
        x1, x2 = x[..., : self.dh // 2], x[..., self.dh // 2 :]
        return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)

    def __call__(self, input_ids, past):
        torch = self.torch
        from torch.nn import functional as F  # noqa: N812

        b, s = input_ids.shape
        p = past.shape[3]
        positions = torch.arange(p, p + s, device=input_ids.device)
        x = self.net["embed"](input_ids)
        present = []
        for i, layer in enumerate(self.net["layers"]):
            h = layer["n1"](x)
            q = layer["q"](h).reshape(b, s, self.HEADS, self.dh).transpose(1, 2)
            kv = layer["kv"](h).reshape(b, s, 2, self.KV_HEADS, self.dh).permute(2, 0, 3, 1, 4)
            k = torch.cat([past[:, 2 * i], self._rope(kv[0], positions)], dim=2)
            v = torch.cat([past[:, 2 * i + 1], kv[1]], dim=2)
            present += [k, v]
            q = self._rope(q, positions)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=s > 1 and p == 0, enable_gqa=True)
            x = x + layer["o"](a.transpose(1, 2).reshape(b, s, self.WIDTH))
            gate, up = layer["up"](layer["n2"](x)).chunk(2, dim=-1)
            x = x + layer["down"](F.silu(gate) * up)
        last = self.net["norm"](x[:, -1])
        logits = last @ self.net["embed"].weight.T  # tied, as SmolLM2's
        return logits, torch.stack(present, dim=1)


def _llm_decoder(torch, device):
    return _LlamaStep(torch, device)


def _emotion_encoder(torch, device):
    from transformers import BertConfig, BertModel

    config = BertConfig(
        hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536
    )
    net = _half(torch, BertModel(config), device)

    def forward(input_ids):
        states = net(input_ids=input_ids).last_hidden_state
        return (torch.nn.functional.normalize(states.mean(dim=1), dim=1),)

    return forward


def _tts_vits(torch, device):
    from transformers import VitsConfig, VitsModel

    # Piper "medium": 192 hidden, 6 layers, 2 heads, 768 filter, 512 upsampling channels,
    # hop 256 (8x8x2x2), 256 phoneme symbols, 22050 Hz.
    config = VitsConfig(vocab_size=256, sampling_rate=22050, upsample_rates=[8, 8, 2, 2])
    # FP32: the duration flow's spline (a quadratic root) leaves FP16's range.
    net = VitsModel(config).to(device).eval()
    # Random weights predict random durations: scale them so that the example's phonemes
    # last what the packaged voice says them in (~14 phonemes/s), as the real model would.
    with torch.inference_mode():
        phonemes = _ids(torch, device, 1, PHONEMES, 256)
        for _ in range(3):  # durations are rounded up per phoneme: not quite proportional
            seconds = net(input_ids=phonemes).waveform.shape[-1] / config.sampling_rate
            net.speaking_rate *= seconds / (PHONEMES / PHONEMES_PER_S)

    def forward(phonemes):
        return (net(input_ids=phonemes).waveform,)

    return forward


def _lipsync(torch, device):
    from networks.lipsync import load_model

    net = load_model().to(device).eval()  # FP32: its log-mel front end wants the range
    return lambda audio: net(audio.float())


def _mel(torch, device, batch, frames):
    return torch.randn(batch, 80, frames, device=device, dtype=_float(torch, device))


def _ids(torch, device, batch, n, vocab):
    return torch.randint(0, vocab, (batch, n), device=device, dtype=torch.int64)


def _kv(torch, device, shape: tuple[int, ...]):
    """A KV cache [B, 2L, heads, past, Dh] of small random values."""
    return torch.randn(*shape, device=device, dtype=_float(torch, device)) * 0.1


FP, I64 = "fp16", "int64"
STAGES: dict[str, Stage] = {
    s.name: s
    for s in (
        Stage(
            "turn_detector",
            _turn_detector,
            lambda t, d, b: {"mel": _mel(t, d, b, TURN_FRAMES)},
            (TensorDef("mel", FP, (80, TURN_FRAMES)),),
            (TensorDef("probability", FP, (1,)),),
        ),
        Stage(
            "asr_encoder",
            _asr_encoder,
            lambda t, d, b: {"mel": _mel(t, d, b, ASR_FRAMES)},
            (TensorDef("mel", FP, (80, -1)),),
            (TensorDef("cross_kv", FP, (12, 8, -1, 64)),),
        ),
        Stage(
            "asr_decoder",
            _asr_decoder,
            lambda t, d, b: {
                "tokens": _ids(t, d, b, 1, 51865),
                "self_kv": _kv(t, d, (b, 12, 8, 12, 64)),
                "cross_kv": _kv(t, d, (b, 12, 8, ASR_FRAMES // 2, 64)),
            },
            (
                TensorDef("tokens", I64, (-1,)),
                TensorDef("self_kv", FP, (12, 8, -1, 64)),
                TensorDef("cross_kv", FP, (12, 8, -1, 64)),
            ),
            (TensorDef("logits", FP, (51865,)), TensorDef("self_kv_out", FP, (12, 8, -1, 64))),
        ),
        Stage(
            "llm_decoder",
            _llm_decoder,
            lambda t, d, b: {
                "input_ids": _ids(t, d, b, 1, 49152),
                "past": _kv(t, d, (b, 60, 3, PROMPT_TOKENS, 64)),
            },
            (TensorDef("input_ids", I64, (-1,)), TensorDef("past", FP, (60, 3, -1, 64))),
            (TensorDef("logits", FP, (49152,)), TensorDef("present", FP, (60, 3, -1, 64))),
        ),
        Stage(
            "emotion_encoder",
            _emotion_encoder,
            lambda t, d, b: {"input_ids": _ids(t, d, b, EMOTION_TOKENS, 30522)},
            (TensorDef("input_ids", I64, (-1,)),),
            (TensorDef("embedding", FP, (384,)),),
        ),
        Stage(
            "tts_vits",
            _tts_vits,
            lambda t, d, b: {"phonemes": _ids(t, d, b, PHONEMES, 256)},
            (TensorDef("phonemes", I64, (-1,)),),
            (TensorDef("audio", "fp32", (-1,)),),
        ),
        Stage(
            "lipsync",
            _lipsync,
            lambda t, d, b: {"audio": t.randn(b, LIPSYNC_SAMPLES, device=d) * 0.1},
            (TensorDef("audio", "fp32", (LIPSYNC_SAMPLES,)),),
            (TensorDef("viseme_probs", "fp32", (-1, 15)), TensorDef("mouth_open", "fp32", (-1,))),
        ),
    )
}


# --- timing ---------------------------------------------------------------------------------


def summary(values_ms: list[float]) -> dict[str, float]:
    ordered = sorted(values_ms)
    p95 = ordered[min(len(ordered) - 1, math.ceil(0.95 * len(ordered)) - 1)]
    return {"p50": round(statistics.median(ordered), 3), "p95": round(p95, 3), "n": len(ordered)}


def time_call(torch, device, call: Callable[[], Any], reps: int, warmup: int = 3) -> list[float]:
    """Milliseconds per call: CUDA events on a GPU (device time, synchronised), else wall."""
    with torch.inference_mode():
        for _ in range(warmup):
            call()
        out = []
        for _ in range(reps):
            if device.type == "cuda":
                start, end = (
                    torch.cuda.Event(enable_timing=True),
                    torch.cuda.Event(enable_timing=True),
                )
                start.record()
                call()
                end.record()
                end.synchronize()
                out.append(start.elapsed_time(end))
            else:
                t0 = time.perf_counter()
                call()
                out.append((time.perf_counter() - t0) * 1000)
    return out


def in_process(
    device_name: str, reps: int, batches: tuple[int, ...], graphs: bool = False
) -> dict[str, Any]:
    """Each network alone, no server: the floor the served stage is compared with."""
    import torch

    device = torch.device(device_name)
    torch.manual_seed(0)
    results: dict[str, Any] = {}
    for stage in STAGES.values():
        try:
            results[stage.name] = _time_stage(torch, device, stage, reps, batches, graphs=graphs)
        except Exception as exc:  # report and go on: one failing stage is not all
            log.exception("stage %s failed", stage.name)
            results[stage.name] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return results


def _time_stage(
    torch, device, stage: Stage, reps: int, batches: tuple[int, ...], *, graphs: bool = False
) -> dict:
    forward = stage.build(torch, device)
    rows = {}
    for batch in batches:
        inputs = stage.example(torch, device, batch)
        rows[f"batch{batch}"] = summary(
            time_call(torch, device, lambda f=forward, i=inputs: f(**i), reps)
        )
    if stage.name == "llm_decoder":  # the prompt's prefill: one call over 320 tokens
        ids = _ids(torch, device, 1, PROMPT_TOKENS, 49152)
        empty = _kv(torch, device, (1, 60, 3, 0, 64))
        rows["prefill"] = summary(time_call(torch, device, lambda f=forward: f(ids, empty), reps))
    if graphs and device.type == "cuda" and stage.name != "tts_vits":  # VITS: data-dependent
        example = stage.example(torch, device, 1)
        try:
            rows["graph_batch1"] = summary(graph_replay_ms(torch, forward, example, reps))
        except Exception as exc:  # e.g. a host sync inside the network: not capturable
            rows["graph_batch1"] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
    return rows


def graph_replay_ms(torch, forward, inputs: dict[str, Any], reps: int) -> list[float]:
    """The network captured once as a CUDA graph and replayed: its kernels without Python's
    launch cost, about what a TensorRT engine's enqueue pays."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.inference_mode(), torch.cuda.stream(stream):
        for _ in range(3):  # warm-up on the side stream, as capture requires
            forward(**inputs)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.inference_mode(), torch.cuda.graph(graph):
        forward(**inputs)
    return time_call(torch, torch.device("cuda"), graph.replay, reps)


# --- Triton: a repository of stage models and one BLS chain --------------------------------

_TYPES = {"fp16": "TYPE_FP16", "fp32": "TYPE_FP32", "int64": "TYPE_INT64"}


def _tensor_config(kind: str, t: TensorDef, gpu: bool) -> str:
    dims = ", ".join(str(d) for d in (-1, *t.dims))
    dtype = t.dtype if gpu else t.dtype.replace("fp16", "fp32")  # a CPU runs FP32
    return f'{kind} [{{ name: "{t.name}" data_type: {_TYPES[dtype]} dims: [ {dims} ] }}]'


def _config(
    name: str, inputs: str, outputs: str, gpu: bool, extra: str = "", *, count: int = 1
) -> str:
    kind = "KIND_GPU" if gpu else "KIND_CPU"
    return (
        f'name: "{name}"\nbackend: "python"\nmax_batch_size: 0\n{inputs}\n{outputs}\n'
        f"instance_group [{{ count: {count} kind: {kind} }}]\n"
        # Inputs stay where the caller put them (GPU), not copied to the host first.
        'parameters { key: "FORCE_CPU_ONLY_INPUT_TENSORS" value: { string_value: "no" } }\n'
        f'parameters {{ key: "repo_root" value: {{ string_value: "{ROOT}" }} }}\n{extra}'
    )


def write_repository(folder: Path, gpu: bool, instances: int = 1) -> Path:
    """The stage models (`instances` of each) and the BLS chain, written under `folder`."""
    here = Path(__file__).resolve().parent
    for stage in STAGES.values():
        version = folder / stage.name / "1"
        version.mkdir(parents=True)
        shutil.copy(here / "gpu_stage_model.py", version / "model.py")
        inputs = "\n".join(_tensor_config("input", t, gpu) for t in stage.inputs)
        outputs = "\n".join(_tensor_config("output", t, gpu) for t in stage.outputs)
        (folder / stage.name / "config.pbtxt").write_text(
            _config(stage.name, inputs, outputs, gpu, count=instances)
        )
    version = folder / "turn_chain" / "1"
    version.mkdir(parents=True)
    shutil.copy(here / "gpu_chain_model.py", version / "model.py")
    (folder / "turn_chain" / "config.pbtxt").write_text(
        _config(
            "turn_chain",
            'input [{ name: "reps" data_type: TYPE_INT32 dims: [ 1 ] }]',
            'output [{ name: "timings" data_type: TYPE_UINT8 dims: [ -1 ] }]',
            gpu=False,
            extra='parameters { key: "device" value: { string_value: "%s" } }\n'
            % ("cuda" if gpu else "cpu"),
        )
    )
    return folder


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


def chain_once(torch, device, call: Callable[[str, dict[str, Any]], dict[str, Any]]):
    """The turn's critical path once, through `call(model, inputs) -> outputs`; ms per stage.

    Every tensor handed on is the previous stage's output as it came back (on the GPU)."""
    ms: dict[str, float] = {}

    def timed(label: str, model: str, inputs: dict[str, Any]) -> dict[str, Any]:
        t0 = time.perf_counter()
        out = call(model, inputs)
        ms[label] = ms.get(label, 0.0) + (time.perf_counter() - t0) * 1000
        return out

    timed("turn_detector", "turn_detector", STAGES["turn_detector"].example(torch, device, 1))
    cross = timed("asr_encoder", "asr_encoder", {"mel": _mel(torch, device, 1, ASR_FRAMES)})
    cross_kv = cross["cross_kv"]
    tokens = _ids(torch, device, 1, 4, 51865)  # Whisper's start tokens
    self_kv = _kv(torch, device, (1, 12, 8, 0, 64))
    for _ in range(TRANSCRIPT_TOKENS):
        step = timed(
            "asr_decoder",
            "asr_decoder",
            {"tokens": tokens, "self_kv": self_kv, "cross_kv": cross_kv},
        )
        tokens = step["logits"].argmax(dim=-1, keepdim=True)
        self_kv = step["self_kv_out"]
    ids = _ids(torch, device, 1, PROMPT_TOKENS, 49152)
    past = _kv(torch, device, (1, 60, 3, 0, 64))
    out = timed("llm_prefill", "llm_decoder", {"input_ids": ids, "past": past})
    for _ in range(CLAUSE_TOKENS):
        ids = out["logits"].argmax(dim=-1, keepdim=True)
        out = timed("llm_clause", "llm_decoder", {"input_ids": ids, "past": out["present"]})
    timed("emotion_encoder", "emotion_encoder", STAGES["emotion_encoder"].example(torch, device, 1))
    wave = timed("tts_vits", "tts_vits", STAGES["tts_vits"].example(torch, device, 1))["audio"]
    audio = wave[:, :LIPSYNC_SAMPLES].float().contiguous()
    if audio.shape[1] < LIPSYNC_SAMPLES:  # random weights say a random length: pad
        audio = torch.nn.functional.pad(audio, (0, LIPSYNC_SAMPLES - audio.shape[1]))
    timed("lipsync", "lipsync", {"audio": audio})
    return ms


# After the end of speech, before the first audio: the turn model, ASR, the prompt and the
# first clause of the LLM, the clause's emotion and its TTS (lipsync runs beside playback).
CRITICAL_PATH = (
    "turn_detector",
    "asr_encoder",
    "asr_decoder",
    "llm_prefill",
    "llm_clause",
    "emotion_encoder",
    "tts_vits",
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
    of `perf.gpu_capacity`); its JSON answer."""
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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--skip-served", action="store_true", help="the networks alone only")
    parser.add_argument(
        "--graphs", action="store_true", help="also each network replayed as a CUDA graph"
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help=f"the figures as JSON ({OUT}; --sessions: capacity.json)",
    )
    parser.set_defaults(func=run)


def device_report(device: str) -> dict[str, Any] | None:
    """What the run is on (torch, the GPU's name); None when CUDA is asked for and absent."""
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        log.error("gpu-stages: torch sees no CUDA device (--device cpu checks the code path)")
        return None
    report: dict[str, Any] = {"device": device, "torch": torch.__version__}
    if device == "cuda":
        report["gpu"] = torch.cuda.get_device_name(0)
    return report


def run(args: argparse.Namespace) -> int:
    report = device_report(args.device)
    if report is None:
        return 2
    args.out = args.out or OUT
    report["in_process"] = in_process(args.device, args.reps, tuple(args.batches), args.graphs)
    print(json.dumps({"in_process": report["in_process"]}, indent=1), flush=True)
    if not args.skip_served:
        try:
            report["served"] = served(args.device, args.reps)
        except Exception as exc:  # the networks' figures above still stand
            log.exception("the served chain failed")
            report["served"] = {"error": f"{type(exc).__name__}: {exc}"}
        print(json.dumps({"served": report["served"]}, indent=1), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    return 0 if "error" not in report.get("served", {}) else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_arguments(parser)  # the --sessions sweep: python -m perf gpu-stages (perf.gpu_capacity)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
