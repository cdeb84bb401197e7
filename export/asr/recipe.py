"""Whisper -> ONNX: `asr_encoder` and `asr_decoder` (KV cache) artifact recipes.

    python -m export.asr              build (or find cached) both artifacts, print their folders
    python -m export.asr --report     measured figures: transcripts vs faster-whisper, timings,
                                      short encoder windows, INT8 / FP16 variants

Each build traces on one set of shapes and verifies on others against the torch model (and,
for the decoder, against transformers' own full-sequence forward), then writes its INT8 Q/DQ
variant `model.int8.onnx` with the calibration record and the WER gate in the sidecar
(export/asr/int8.py). `model.fp16.onnx` is written on request (the report measures it).
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import numpy as np

from avatar.asr.onnx_runtime import DECODER_STEP_FILE
from export.common import (
    ArtifactRecipe,
    Tolerance,
    compare_outputs,
    ensure,
    onnx_session,
    torch_to_onnx,
    worst,
)
from export.onnx_edit import add_state_input, set_output_dims
from export.sidecar import Sidecar, sha256_file

log = logging.getLogger(__name__)

OPSET = 17
HERE = Path(__file__).parent
ENCODER_TOLERANCE = {
    "encoder_hidden_states": Tolerance(2e-3, 1e-3),
    "cross_kv": Tolerance(2e-3, 1e-3),
}
DECODER_TOLERANCE = {"logits": Tolerance(2e-3, 1e-3), "self_kv_out": Tolerance(1e-3, 1e-3)}
# the graphs' tensors, inputs first, and their dynamic axes
ENCODER_AXES = {
    "mel": {0: "batch", 2: "frames"},
    "encoder_hidden_states": {0: "batch", 1: "positions"},
    "cross_kv": {0: "batch", 3: "positions"},
}
DECODER_AXES = {
    "tokens": {0: "batch", 1: "tokens"},
    "self_kv": {0: "batch", 3: "past"},
    "cross_kv": {0: "batch", 3: "positions"},
    "logits": {0: "batch"},
    "self_kv_out": {0: "batch", 3: "total"},
}


class _WhisperRecipe(ArtifactRecipe):
    code_files = (
        HERE / "modules.py",
        HERE / "weights.py",
        HERE.parent / "onnx_edit.py",
        HERE.parent / "quantize.py",
        HERE.parent / "gates.py",
        HERE / "int8.py",
        HERE.parents[1] / "evals" / "clips.py",  # the INT8 variant's calibration speech
        HERE.parents[1] / "evals" / "asr.py",  # the served windows calibration decodes with
    )  # the gate's own code (WER, human recordings) keys its verdict: export.gates.gate_code

    def __init__(self, source: str | None = None, variants: bool = False):
        self.source = source  # None: the packaged CTranslate2 Whisper base
        self.variants = variants  # model.fp16.onnx too (on request; INT8 always)

    def key_inputs(self) -> dict[str, str]:
        extra = {"variants": "fp16"} if self.variants else {}
        if self.source is None:
            from export.asr.weights import packaged_parts

            return {p.name: sha256_file(p) for p in packaged_parts()} | extra
        return {"source": str(self.source)} | extra

    def load_model(self):  # -> WhisperForConditionalGeneration
        import torch

        from export.asr.weights import load_whisper

        torch.manual_seed(0)
        return load_whisper(self.source)

    def _variants(self, out_dir: Path, model, kind: str) -> dict:
        """The INT8 Q/DQ variant (always) and FP16 (on request); the sidecar's records."""
        from export.asr.int8 import VARIANT_FILE, build_variant

        variants = {VARIANT_FILE: build_variant(kind, out_dir, model)}
        if self.variants:
            import onnx
            from onnxruntime.transformers.float16 import convert_float_to_float16

            source = out_dir / ("model.onnx" if kind == "encoder" else DECODER_STEP_FILE)
            fp16 = convert_float_to_float16(onnx.load(str(source)), keep_io_types=True)
            onnx.save(fp16, str(out_dir / "model.fp16.onnx"))
        return variants

    @staticmethod
    def _trace(module, args, path: Path, axes: dict[str, dict[int, str]], inputs: int) -> Path:
        """`module` traced into `path`: its first `inputs` tensors of `axes` in, the rest out."""
        names = list(axes)
        return torch_to_onnx(module, args, path, inputs=names[:inputs], outputs=names[inputs:],
                             opset=OPSET, dynamic_axes=axes)  # fmt: skip

    def _sidecar(self, path: Path, validation: dict, notes: list[str]) -> Sidecar:
        return self.sidecar(path, opset=OPSET, source=self.key_inputs(), validation=validation,
                            notes=notes)  # fmt: skip


class EncoderRecipe(_WhisperRecipe):
    """mel [batch, 80, frames] -> encoder_hidden_states [batch, positions, 512],
    cross_kv [batch, 12, 8, positions, 64] (positions = frames / 2)."""

    name = "asr_encoder"

    def build(self, out_dir: Path) -> Sidecar:
        import torch

        from export.asr.modules import WhisperEncoderExport

        model = self.load_model()
        module = WhisperEncoderExport(model).eval()
        n_mels = model.config.num_mel_bins
        trace = torch.randn(2, n_mels, 3000)
        path = self._trace(module, [trace], out_dir / "model.onnx", ENCODER_AXES, inputs=1)
        kv_dims = [2 * model.config.decoder_layers, model.config.decoder_attention_heads]
        head = model.config.d_model // model.config.decoder_attention_heads
        set_output_dims(path, {"cross_kv": ["batch", *kv_dims, "positions", head]})
        session = onnx_session(path, threads=2)
        rng = np.random.default_rng(1)
        comparisons = []
        for batch, frames in ((1, 3000), (3, 1000)):  # not the traced shapes
            mel = rng.uniform(-1.0, 1.5, (batch, n_mels, frames)).astype(np.float32)
            with torch.no_grad():
                hidden, kv = module(torch.from_numpy(mel))
                full = (
                    model.model.encoder(torch.from_numpy(mel)).last_hidden_state
                    if frames == 3000
                    else hidden
                )
            reference = {"encoder_hidden_states": hidden.numpy(), "cross_kv": kv.numpy()}
            got = dict(
                zip(
                    ["encoder_hidden_states", "cross_kv"],
                    session.run(None, {"mel": mel}),
                    strict=True,
                )
            )
            comparisons += compare_outputs(
                reference, got, ENCODER_TOLERANCE, f"batch {batch}, {frames} frames"
            )
            comparisons += compare_outputs(
                {"encoder_hidden_states": full.numpy()}, got,
                {"encoder_hidden_states": Tolerance(5e-3, 1e-3)}, "vs transformers",
            )  # fmt: skip
        variants = self._variants(out_dir, model, "encoder")
        return self._sidecar(
            path,
            {"vs_torch": worst(comparisons), "variants": variants},
            ["frames may be < 3000: positions use the first frames/2 positional embeddings"],
        )


class DecoderRecipe(_WhisperRecipe):
    """Two graphs of one decoder step (avatar.asr.onnx_runtime.DECODER_STEP_FILE says why):

    model.step.onnx: tokens [batch, tokens] int64, self_kv [batch, 12, 8, past, 64], cross_kv
    [batch, 12, 8, positions, 64] -> logits [batch, 51865] (last position), self_kv_out
    [batch, 12, 8, past + tokens, 64].

    model.onnx, the sequence form served with implicit state: also encoder_kv [batch, 12, 8,
    new_positions, 64] in and cross_kv_out out; the step reads Concat(cross_kv, encoder_kv)
    and returns it as cross_kv_out. A START step sends the encoder's K/V as encoder_kv (the
    state starts empty), later steps send it empty."""

    name = "asr_decoder"

    def build(self, out_dir: Path) -> Sidecar:
        import torch

        from export.asr.modules import WhisperDecoderExport, WhisperEncoderExport

        model = self.load_model()
        module = WhisperDecoderExport(model).eval()
        cfg = model.config
        layers, heads = cfg.decoder_layers, cfg.decoder_attention_heads
        dh = cfg.d_model // heads
        trace = (
            torch.randint(0, 50000, (2, 2)),
            torch.randn(2, 2 * layers, heads, 3, dh),
            torch.randn(2, 2 * layers, heads, 1500, dh),
        )
        path = self._trace(module, trace, out_dir / DECODER_STEP_FILE, DECODER_AXES, inputs=3)
        set_output_dims(path, {"self_kv_out": ["batch", 2 * layers, heads, "total", dh]})
        session = onnx_session(path, threads=2)
        rng = np.random.default_rng(2)
        comparisons = []
        encoder = WhisperEncoderExport(model).eval()
        mel = torch.from_numpy(
            rng.uniform(-1.0, 1.5, (3, cfg.num_mel_bins, 3000)).astype(np.float32)
        )
        ids = torch.tensor([[50258, 50259, 50359, 50364, 400, 1002, 13]] * 3) + torch.tensor(
            [[0], [1], [2]]
        ) * torch.tensor([0, 0, 0, 0, 1, 1, 1])
        with torch.no_grad():
            _, cross = encoder(mel)
            full = model(input_features=mel, decoder_input_ids=ids).logits[:, -1].numpy()
        kv = np.zeros((3, 2 * layers, heads, 0, dh), np.float32)
        for lo, hi in ((0, 1), (1, 3), (3, 4), (4, 7)):  # empty past, 1 and 3 new tokens
            feeds = {"tokens": ids[:, lo:hi].numpy(), "self_kv": kv, "cross_kv": cross.numpy()}
            with torch.no_grad():
                ref = module(*(torch.from_numpy(v) for v in feeds.values()))
            got = dict(zip(["logits", "self_kv_out"], session.run(None, feeds), strict=True))
            reference = {"logits": ref[0].numpy(), "self_kv_out": ref[1].numpy()}
            comparisons += compare_outputs(reference, got, DECODER_TOLERANCE, f"tokens {lo}:{hi}")
            kv = got["self_kv_out"]
        comparisons += compare_outputs(
            {"logits": full},
            got,
            {"logits": Tolerance(5e-3, 1e-3)},
            "vs transformers full sequence",
        )
        served = out_dir / "model.onnx"
        add_state_input(
            path, served, state="cross_kv", new="encoder_kv", output="cross_kv_out", axis=3,
            axes=("cached_positions", "new_positions", "positions"),
        )  # fmt: skip
        sequence = _check_sequence_form(served, session, cross.numpy(), ids.numpy())
        variants = self._variants(out_dir, model, "decoder")
        variants[DECODER_STEP_FILE] = {
            "passes_gate": True,
            "gate": "the same network as model.onnx without its state output",
            "why": "model.onnx's outputs equal its outputs step by step (sequence_vs_step)",
        }
        return self._sidecar(
            served,
            {
                "vs_torch": worst(comparisons),
                "sequence_vs_step": worst(sequence),
                "variants": variants,
            },
            [f"{DECODER_STEP_FILE}: the stateless step the CPU runs (no state output to copy)"],
        )


def _check_sequence_form(path: Path, step, cross: np.ndarray, ids: np.ndarray) -> list:
    """Run the sequence form as the server does (START with encoder_kv and empty state, then
    the state fed back and encoder_kv empty) beside the step graph: per-output comparisons
    (cross_kv_out must be the encoder's K/V exactly)."""
    sequence = onnx_session(path, threads=2)
    names = [o.name for o in sequence.get_outputs()]
    empty = np.zeros((*cross.shape[:3], 0, cross.shape[4]), np.float32)
    state = {"self_kv": empty, "cross_kv": empty}
    kv, comparisons = empty, []
    tolerances = {**DECODER_TOLERANCE, "cross_kv_out": Tolerance(0.0, 0.0)}
    for k, (lo, hi) in enumerate(((0, 1), (1, 3), (3, 4))):
        tokens = ids[:, lo:hi]
        logits, kv = step.run(None, {"tokens": tokens, "self_kv": kv, "cross_kv": cross})
        feeds = {"tokens": tokens, **state, "encoder_kv": cross if k == 0 else empty}
        got = dict(zip(names, sequence.run(None, feeds), strict=True))
        reference = {"logits": logits, "self_kv_out": kv, "cross_kv_out": cross}
        comparisons += compare_outputs(reference, got, tolerances, f"sequence form, step {k}")
        state = {"self_kv": got["self_kv_out"], "cross_kv": got["cross_kv_out"]}
    return comparisons


def build_all(
    source: str | None = None, force: bool = False, variants: bool = False
) -> tuple[Path, Path]:
    """(encoder folder, decoder folder), built or found in the cache."""
    return (
        ensure(EncoderRecipe(source, variants), force=force),
        ensure(DecoderRecipe(source, variants), force=force),
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--source", help="Whisper checkpoint: CT2 folder, HF folder or hub id")
    parser.add_argument("--force", action="store_true", help="rebuild even if cached")
    parser.add_argument("--report", action="store_true", help="print measured figures")
    parser.add_argument("--clips", type=int, default=None, help="report: number of clips")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    # the report compares the INT8/FP16 variants: build them with it
    encoder, decoder = build_all(args.source, args.force, variants=args.report)
    log.info("asr_encoder: %s", encoder)
    log.info("asr_decoder: %s", decoder)
    if args.report:
        from evals.asr_report import report
        from export.asr.weights import packaged_ct2_dir
        from export.common import cache_root

        report(encoder, decoder, packaged_ct2_dir(), cache_root(), args.clips)
