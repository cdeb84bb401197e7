"""Stream audio through the `vad` model over gRPC and print the speech segments.

python -m clients.vad_stream --url 127.0.0.1:8001 question.wav
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient

from avatar.audio import read_wav, resample
from avatar.model_io import VAD, infer_inputs
from avatar.vad import OUTPUTS, SAMPLE_RATE, Segment, speech_probabilities, speech_segments

log = logging.getLogger(__name__)


def infer(client: grpcclient.InferenceServerClient, model: str, arrays: dict[str, np.ndarray]):
    inputs = infer_inputs(arrays, grpcclient.InferInput)  # VadStream.inputs: avatar.model_io.VAD
    outputs = [grpcclient.InferRequestedOutput(name) for name in OUTPUTS]
    result = client.infer(model, inputs, outputs=outputs)
    return VAD.read_rows({name: result.as_numpy(name) for name in OUTPUTS})


def served_probabilities(url: str, audio: np.ndarray, model: str = "vad") -> np.ndarray:
    """Per-32-ms speech probability of 16 kHz mono `audio`, one gRPC call per chunk."""
    with grpcclient.InferenceServerClient(url) as client:
        return speech_probabilities(lambda feeds: infer(client, model, feeds), audio)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("wav", type=Path, help="a 16-bit PCM WAV (resampled to 16 kHz)")
    parser.add_argument("--url", default="127.0.0.1:8001", help="Triton gRPC address")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    audio, rate = read_wav(args.wav)
    audio = resample(audio, rate, SAMPLE_RATE)
    started = time.perf_counter()
    probs = served_probabilities(args.url, audio)
    elapsed = time.perf_counter() - started
    segments: list[Segment] = speech_segments(probs)
    log.info(
        "%s: %.2f s of audio, %d chunks in %.2f s (%.2f ms per gRPC call)",
        args.wav.name,
        len(audio) / SAMPLE_RATE,
        len(probs),
        elapsed,
        1000 * elapsed / len(probs),
    )
    for seg in segments:
        log.info("  speech %6.2f s - %6.2f s", seg.start_s, seg.end_s)
    return 0 if segments else 1


if __name__ == "__main__":
    sys.exit(main())
