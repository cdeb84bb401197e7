"""INT8 Q/DQ variants of the Whisper encoder and decoder, judged by word error rate on real
human speech: built with each artifact (`model.int8.onnx` beside `model.onnx`), and
compared scheme by scheme, timed side by side with FP32:

    python -m export.asr.int8 [--schemes a,b] [--no-timings] [--out build/perf/asr_int8.json]

(without --schemes: the variants the artifacts ship, against FP32)

Calibration (recorded in `calibration.json` beside the variant): the packaged voice's
verification clips (evals/clips.py: fixed texts, no noise, so the same samples every
run), windowed as the `asr` model serves them (window_step 100, window_margin 300). The
encoder calibrates on those mel windows; the decoder on the step inputs seen while the
FP32 networks decode them greedily. The gate uses other audio: Debian's
pocketsphinx-testdata human recordings (evals/recordings.py), never the calibration clips.

Quantisation: ONNX Runtime `quantize_static` in QDQ format (TensorRT's explicit-precision
format, so `export engines --precision int8` builds from it), per-channel symmetric INT8
weights, symmetric INT8 activations, MinMax calibration. `SCHEMES` are what was tried;
`BUILT` is the one each artifact ships: the linear layers except the MLP's down projection
(fc2, whose GELU inputs have long tails). Quantising every MatMul (attention's q@k and p@v
too) or clipping activations at a percentile broke the transcripts (docs/performance.md).

Gate, per network with the other one in FP32 (the build uses the PyTorch export module for
the other half, so neither artifact needs the other): the verdict of `evals.asr.int8_verdict`,
corpus WER within 1 point absolute of FP32 on two sets, each on its own: the human clips as
a live question is served, and long recordings cut by the exported VAD as the `asr` model
serves them (the sets and why: evals/asr.py).
Speed, FP32 and INT8 alternated in one run, is recorded beside it. The variant is served on the
CPU where a config asks for it (`embedded_onnx_variant`) and its gate passed
(serving.repository).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import logging
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path

import numpy as np

from avatar.asr.features import pad_or_trim
from avatar.asr.greedy import WhisperRuntime
from avatar.asr.onnx_runtime import DECODER_STEP_FILE, OnnxWhisperRuntime
from avatar.asr.transcribe import transcribe
from avatar.asr.vocab import WhisperVocab
from evals.asr import (
    SERVED,
    WINDOW_MARGIN,
    WINDOW_STEP,
    Speech,
    compare_runtimes,
    gate_clips,
    int8_verdict,
    long_form_clips,
    long_form_speech,
    print_table,
)
from evals.asr import network_timer as timer
from evals.clips import Clip, clips
from evals.gate import faster, side_by_side
from evals.recordings import MissingRecordingsError
from export.asr.weights import packaged_ct2_dir
from export.common import cache_root
from export.gates import judged
from export.quantize import VARIANT_FILE, linear_nodes, quantize_qdq

log = logging.getLogger(__name__)


def fp32_file(kind: str) -> str:
    """The FP32 graph a network's INT8 variant is made from and judged against: the encoder's
    model.onnx, the decoder's stateless step (the CPU runs it; export/asr/recipe.py)."""
    return "model.onnx" if kind == "encoder" else DECODER_STEP_FILE


def _vocab() -> WhisperVocab:
    ct2 = packaged_ct2_dir()
    return WhisperVocab.load(ct2 / "tokenizer.json", ct2 / "config.json")


class TorchWhisperRuntime(WhisperRuntime):
    """The PyTorch export modules (export/asr/modules.py): the FP32 reference for the half
    of a transcription that a gate does not judge."""

    def __init__(self, model):
        from export.asr.modules import WhisperDecoderExport, WhisperEncoderExport

        self.encoder = WhisperEncoderExport(model).eval()
        self.decoder = WhisperDecoderExport(model).eval()

    def encode(self, mel):
        import torch

        with torch.no_grad():
            return self.encoder(torch.from_numpy(mel.astype(np.float32)))[1].numpy()

    def decode(self, tokens, self_kv, cross_kv):
        import torch

        with torch.no_grad():
            logits, present = self.decoder(
                *(torch.from_numpy(np.ascontiguousarray(a)) for a in (tokens, self_kv, cross_kv))
            )
        return logits.numpy(), present.numpy()


class SplitRuntime(WhisperRuntime):
    """The encoder of one runtime with the decoder of another."""

    def __init__(self, encoder: WhisperRuntime, decoder: WhisperRuntime):
        self.encoder, self.decoder = encoder, decoder

    def encode(self, mel):
        return self.encoder.encode(mel)

    def decode(self, tokens, self_kv, cross_kv):
        return self.decoder.decode(tokens, self_kv, cross_kv)


def half_onnx(kind: str, path: Path, other: WhisperRuntime) -> WhisperRuntime:
    """One network (`kind`: encoder or decoder) from an ONNX file, the other from `other`."""
    if kind == "encoder":
        return SplitRuntime(OnnxWhisperRuntime(path, None), other)
    return SplitRuntime(other, OnnxWhisperRuntime(None, path))


class RecordingRuntime(WhisperRuntime):
    """A runtime that keeps every encoder/decoder input it was given (calibration)."""

    def __init__(self, runtime: WhisperRuntime):
        self.runtime = runtime
        self.mels: list[np.ndarray] = []
        self.steps: list[dict[str, np.ndarray]] = []

    def encode(self, mel):
        self.mels.append(mel.astype(np.float32))
        return self.runtime.encode(mel)

    def decode(self, tokens, self_kv, cross_kv):
        self.steps.append({"tokens": tokens, "self_kv": self_kv, "cross_kv": cross_kv})
        return self.runtime.decode(tokens, self_kv, cross_kv)


@dataclasses.dataclass(frozen=True)
class Scheme:
    """What gets quantised and how activations are calibrated (all symmetric INT8, QDQ,
    per-channel weights: what TensorRT's explicit quantisation takes)."""

    name: str
    linear_only: bool  # only MatMul/Gemm with a constant weight (not attention's q@k, p@v)
    method: str  # onnxruntime CalibrationMethod name
    conv: bool = False
    extra: tuple[tuple[str, float], ...] = ()
    skip: tuple[str, ...] = ()  # linear nodes whose name contains one of these stay FP32


SCHEMES = (
    Scheme("minmax-all", linear_only=False, method="MinMax", conv=True),
    Scheme("minmax-linear", linear_only=True, method="MinMax"),
    Scheme(
        "percentile-linear",
        linear_only=True,
        method="Percentile",
        extra=(("CalibPercentile", 99.99),),
    ),
    # the MLP's down projection reads GELU outputs with long tails
    Scheme("minmax-linear-no-fc2", linear_only=True, method="MinMax", skip=("/fc2",)),
    Scheme("minmax-attention", linear_only=True, method="MinMax", skip=("/fc1", "/fc2")),
)
BUILT = SCHEMES[3]  # minmax-linear-no-fc2: within the gate for both networks


def _quantize(source: Path, out: Path, feeds: list[dict[str, np.ndarray]], scheme: Scheme):
    quantize_qdq(
        source,
        out,
        feeds,
        ops=["MatMul", "Gemm", *(["Conv"] if scheme.conv else [])],
        nodes=(
            [n for n in linear_nodes(source) if not any(k in n for k in scheme.skip)]
            if scheme.linear_only
            else None
        ),
        method=scheme.method,
        extra=dict(scheme.extra),
    )


def calibration_feeds(runtime: WhisperRuntime, vocab: WhisperVocab):
    """(encoder feeds, decoder feeds, record of the calibration set): the packaged voice's
    clips, decoded by `runtime` as the `asr` model serves them."""
    recording = RecordingRuntime(runtime)
    items = clips()
    for clip in items:
        transcribe(recording, vocab, [clip.audio], SERVED)
    # every 3rd decoder step: consecutive steps differ by one token; keeps memory bounded
    steps = recording.steps[::3]
    record = {
        "clips": [
            {"text": c.text, "sha256": hashlib.sha256(c.audio.tobytes()).hexdigest()[:16]}
            for c in items
        ],
        "options": {"window_step": WINDOW_STEP, "window_margin": WINDOW_MARGIN},
        "encoder_windows": len(recording.mels),
        "decoder_steps": len(steps),
    }
    return [{"mel": m} for m in recording.mels], steps, record


def build_variant(kind: str, out_dir: Path, model) -> dict:
    """`model.int8.onnx` (scheme BUILT) beside the FP32 `model.onnx` of `kind`, its
    calibration record, and its verdict's record (export.gates: recorded, or measured by
    `gate`): the sidecar's record of the variant."""
    vocab = _vocab()
    fp32 = out_dir / fp32_file(kind)
    fp32_runtime = half_onnx(kind, fp32, TorchWhisperRuntime(model))
    enc_feeds, dec_feeds, record = calibration_feeds(fp32_runtime, vocab)
    feeds = enc_feeds if kind == "encoder" else dec_feeds
    record.update(scheme=dataclasses.asdict(BUILT), inputs=len(feeds))
    (out_dir / "calibration.json").write_text(json.dumps(record, indent=2))
    _quantize(fp32, out_dir / VARIANT_FILE, feeds, BUILT)
    return judged(f"asr_{kind}", out_dir / VARIANT_FILE, feeds[0],
                  lambda: gate(kind, out_dir, model))  # fmt: skip


def gate_folder(folder: Path) -> dict:
    """The gate of the variant in the artifact `folder` (asr_encoder or asr_decoder)."""
    import torch

    from export.asr.weights import load_whisper
    from export.sidecar import Sidecar

    kind = Sidecar.load(folder).model.removeprefix("asr_")
    torch.manual_seed(0)  # as the recipe loads it
    return gate(kind, Path(folder), load_whisper(None))


def gate(kind: str, out_dir: Path, model) -> dict:
    """WER on the human recordings, FP32 against INT8 of `kind` (the other network in torch),
    and both timed side by side: the variant's gate record."""
    try:
        humans = gate_clips()
    except MissingRecordingsError as error:  # e.g. an image without the Debian package
        log.warning("%s INT8 variant not gated: %s", kind, error)
        return {
            "passes_gate": False,
            "why": f"not gated: {error}; rebuild with --force once it is installed",
            "scheme": BUILT.name,
            "calibration": "calibration.json",
        }
    reference = TorchWhisperRuntime(model)
    runtimes = {
        "fp32": half_onnx(kind, out_dir / fp32_file(kind), reference),
        "int8": half_onnx(kind, out_dir / VARIANT_FILE, reference),
    }
    verdict = int8_verdict(runtimes, _vocab(), humans, *long_form_set())
    log.info("%s INT8: %s", kind, verdict)
    speed = side_by_side(network_timer(kind, out_dir), rounds=3, warmup=True)
    return {
        **verdict,
        "speed_1_thread": speed,
        "faster": faster(speed),
        "scheme": BUILT.name,
        "calibration": "calibration.json",
    }


def build_variants(
    encoder_dir: Path, decoder_dir: Path, out: Path, vocab: WhisperVocab, scheme: Scheme
) -> dict[str, Path]:
    """INT8 Q/DQ encoder and decoder under `out` (reused when present: the inputs are
    fixed). A network the scheme cannot calibrate is left out (logged)."""
    out.mkdir(parents=True, exist_ok=True)
    paths = {k: out / f"{k}.{scheme.name}.onnx" for k in ("encoder", "decoder")}
    if all(p.is_file() for p in paths.values()):
        return paths
    runtime = OnnxWhisperRuntime(encoder_dir / "model.onnx", decoder_dir / DECODER_STEP_FILE)
    enc_feeds, dec_feeds, record = calibration_feeds(runtime, vocab)
    if scheme.method != "MinMax":
        # histogram calibrators stack each tensor over the samples: one shape for all
        # (encoder windows of 10 s; decoder steps of one token)
        enc_feeds = [{"mel": pad_or_trim(f["mel"][0], 1000)[None]} for f in enc_feeds]
        dec_feeds = [f for f in dec_feeds if f["tokens"].shape == (1, 1)]
    (out / "calibration.json").write_text(json.dumps(record, indent=2))
    sources = {"encoder": (encoder_dir, enc_feeds), "decoder": (decoder_dir, dec_feeds)}
    for kind, (folder, feeds) in sources.items():
        if paths[kind].is_file():
            continue
        log.info("calibrating the %s (%s) on %d inputs", kind, scheme.name, len(feeds))
        try:
            _quantize(folder / fp32_file(kind), paths[kind], feeds, scheme)
        except ValueError as error:  # e.g. a histogram over tensors of several shapes
            log.warning("%s: %s cannot calibrate the %s: %s", out, scheme.name, kind, error)
    return {k: p for k, p in paths.items() if p.is_file()}


@lru_cache(maxsize=1)
def long_form_set() -> tuple[list[Clip], Speech]:
    """`evals.asr.long_form_clips()` and their speech segments from the exported VAD, as the
    `asr` model finds them; made once per process: the encoder and the decoder builds (and
    `measure`) judge on the same set."""
    from avatar.vad import onnx_vad
    from export.common import ensure, onnx_session
    from export.vad.recipe import VadRecipe

    longs = long_form_clips()
    return longs, long_form_speech(
        longs, onnx_vad(onnx_session(ensure(VadRecipe()) / "model.onnx"))
    )


def network_timer(kind: str, folder: Path) -> Callable[[str, int], float]:
    """`evals.asr.network_timer` of one network's FP32 and INT8 files in `folder` (1 thread)."""
    from export.common import onnx_session

    files = {"fp32": fp32_file(kind), "int8": VARIANT_FILE}
    return timer(
        {name: onnx_session(folder / file, threads=1) for name, file in files.items()}, kind
    )


def measure(encoder_dir: Path, decoder_dir: Path, schemes=SCHEMES, timed: bool = True) -> dict:
    """`evals.asr.compare_runtimes` of one row per (encoder, decoder) file pair: FP32/FP32,
    then per scheme its INT8 encoder with the FP32 decoder, the FP32 encoder with its INT8
    decoder, and both. No schemes: the variants the artifacts ship (model.int8.onnx)."""
    vocab = _vocab()
    folder = cache_root() / "asr_int8" / _key(encoder_dir, decoder_dir)
    fp32 = ("fp32", encoder_dir / "model.onnx"), ("fp32", decoder_dir / DECODER_STEP_FILE)
    pairs = [fp32]
    built = {"encoder": encoder_dir / VARIANT_FILE, "decoder": decoder_dir / VARIANT_FILE}
    for scheme in schemes or [BUILT]:
        if schemes:
            variants = build_variants(encoder_dir, decoder_dir, folder, vocab, scheme)
        else:
            variants = {k: v for k, v in built.items() if v.is_file()}
        enc, dec = (scheme.name, variants.get("encoder")), (scheme.name, variants.get("decoder"))
        pairs += [p for p in ((enc, fp32[1]), (fp32[0], dec), (enc, dec)) if p[0][1] and p[1][1]]
    runtimes = [(enc, dec, OnnxWhisperRuntime(ep, dp)) for (enc, ep), (dec, dp) in pairs]
    result = compare_runtimes(runtimes, vocab, *long_form_set(), timed=timed)
    return {**result, "folder": str(folder if schemes else encoder_dir.parent)}


def _key(*folders: Path) -> str:
    text = "".join(f.name for f in folders) + Path(__file__).read_text()
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def main() -> None:
    from export.registry import ensure_all

    parser = argparse.ArgumentParser(prog="python -m export.asr.int8", description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("build/perf/asr_int8.json"))
    parser.add_argument("--no-timings", action="store_true", help="word error rates only")
    parser.add_argument(
        "--schemes",
        default="",
        help=f"comma-separated, of {[s.name for s in SCHEMES]}; default: the built variants",
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    chosen = [s for s in SCHEMES if s.name in args.schemes.split(",")]  # none: built
    art = ensure_all(["asr_encoder", "asr_decoder"])
    result = measure(art["asr_encoder"], art["asr_decoder"], chosen, timed=not args.no_timings)
    print_table(result)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
