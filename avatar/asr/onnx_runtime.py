"""`WhisperRuntime` over two ONNX files run in-process by ONNX Runtime (tests, reports)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from avatar.asr.greedy import WhisperRuntime

# The asr_decoder artifact holds two graphs of one network: `model.onnx`, the sequence form
# served with implicit state (its cross-attention K/V and self-attention cache are state
# inputs/outputs), and this stateless step (tokens, self_kv, cross_kv -> logits,
# self_kv_out), which in-process code and the embedded runner run with the caches they hold.
DECODER_STEP_FILE = "model.step.onnx"


class OnnxWhisperRuntime(WhisperRuntime):
    """encoder/decoder: paths of the `asr_encoder` ONNX file and the `asr_decoder` step
    (DECODER_STEP_FILE; None: that network is not loaded, for a runtime that takes the
    other half elsewhere)."""

    def __init__(self, encoder: Path | None, decoder: Path | None, threads: int = 1):
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.log_severity_level = 3
        cpu = ["CPUExecutionProvider"]

        def session(path: Path | None):
            return ort.InferenceSession(str(path), options, providers=cpu) if path else None

        self.encoder, self.decoder = session(encoder), session(decoder)

    def encode(self, mel: np.ndarray) -> np.ndarray:
        (cross_kv,) = self.encoder.run(["cross_kv"], {"mel": mel.astype(np.float32)})
        return cross_kv

    def decode(
        self, tokens: np.ndarray, self_kv: np.ndarray, cross_kv: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        feeds = {"tokens": tokens.astype(np.int64), "self_kv": self_kv, "cross_kv": cross_kv}
        logits, present = self.decoder.run(["logits", "self_kv_out"], feeds)
        return logits, present
