"""Animate any speech recording through the served `lipsync` model.

    python -m clients.lipsync speech.wav --out speech.json [--mp4 speech.mp4] [--fps 30]

The audio (resampled to 16 kHz) is cut into WINDOW_S windows, each sent with CONTEXT_S
of audio on both sides so that every frame sees the network's whole receptive field;
every window has the same shape, so the windows of one file and of concurrent clients
batch together on the server. The kept centre frames are joined into viseme
probabilities [T, 15] at 100 Hz, which `avatar.animation.lipsync.animate_probs` turns
into the TTS path's viseme weights and ARKit-52 frames.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient

from avatar.animation import AnimationConfig
from avatar.animation.lipsync import animate_probs
from avatar.animation.tables import ARKIT_NAMES, VISEMES
from avatar.audio import read_wav, resample
from avatar.model_io import LIPSYNC, infer_inputs

log = logging.getLogger(__name__)

SAMPLE_RATE = 16000
HOP = 160  # samples per model frame (networks/lipsync.py)
WINDOW_S = 2.0
CONTEXT_S = 0.5  # >= the receptive field (0.33 s) plus half an STFT window
MAX_BATCH = 16  # windows per request: model_repository/lipsync/config.pbtxt max_batch_size
OUTPUTS = tuple(LIPSYNC.outputs)  # viseme_probs, mouth_open


def windows(audio: np.ndarray, window: int, context: int) -> np.ndarray:
    """[n] -> [ceil((n + 1) / window), context + window + context], zero padded."""
    count = max(1, -(-(len(audio) + 1) // window))
    padded = np.zeros(context + count * window + context, np.float32)
    padded[context : context + len(audio)] = audio
    return np.stack([padded[k * window : k * window + window + 2 * context] for k in range(count)])


def infer_windows(client: grpcclient.InferenceServerClient, batch: np.ndarray, model: str):
    """One request: windows [B, S] -> (viseme_probs [B, F, 15], mouth_open [B, F])."""
    inputs = infer_inputs(LIPSYNC.rows(audio=batch), grpcclient.InferInput)
    result = client.infer(
        model, inputs, outputs=[grpcclient.InferRequestedOutput(n) for n in OUTPUTS]
    )
    outputs = LIPSYNC.read_rows({n: result.as_numpy(n) for n in OUTPUTS})
    return outputs["viseme_probs"], outputs["mouth_open"]


def viseme_probs(
    url: str, audio: np.ndarray, model: str = "lipsync", window_s: float = WINDOW_S
) -> tuple[np.ndarray, np.ndarray]:
    """16 kHz mono audio [n] -> viseme_probs [n // 160 + 1, 15], mouth_open [n // 160 + 1].

    Frame i is at i / 100 s, as if the whole file had gone through the model at once.
    """
    window = round(window_s * SAMPLE_RATE / HOP) * HOP
    context = round(CONTEXT_S * SAMPLE_RATE / HOP) * HOP
    pieces = windows(np.asarray(audio, np.float32), window, context)
    keep = slice(context // HOP, (context + window) // HOP)
    probs, opening = [], []
    with grpcclient.InferenceServerClient(url) as client:
        for start in range(0, len(pieces), MAX_BATCH):
            p, o = infer_windows(client, pieces[start : start + MAX_BATCH], model)
            probs.append(p[:, keep].reshape(-1, p.shape[-1]))
            opening.append(o[:, keep].reshape(-1))
    frames = len(audio) // HOP + 1
    return np.concatenate(probs)[:frames], np.concatenate(opening)[:frames]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("wav", type=Path, help="a 16-bit PCM WAV (any rate; mono or averaged)")
    parser.add_argument("--url", default="127.0.0.1:8001", help="Triton gRPC address")
    parser.add_argument("--out", type=Path, help="write the animation as JSON here")
    parser.add_argument("--mp4", type=Path, help="also render the 2D face with the audio")
    parser.add_argument("--fps", type=float, default=30.0)
    parser.add_argument("--alpha", type=float, default=0.7, help="EMA release (0.5..0.9)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    audio, rate = read_wav(args.wav)
    audio16 = resample(audio, rate, SAMPLE_RATE)
    started = time.perf_counter()
    probs, opening = viseme_probs(args.url, audio16)
    elapsed = time.perf_counter() - started
    anim = animate_probs(probs, AnimationConfig(fps=args.fps, alpha=args.alpha),
                         duration=len(audio16) / SAMPLE_RATE)  # fmt: skip
    print(f"{args.wav.name}: {len(audio16) / SAMPLE_RATE:.2f} s of audio -> {len(probs)} model "
          f"frames in {elapsed:.2f} s -> {len(anim.times)} frames at {args.fps:g} fps")  # fmt: skip
    for viseme, start, end in anim.viseme_track():
        print(f"  {start:6.2f}-{end:6.2f} s  {viseme}")
    if args.out:
        args.out.write_text(json.dumps({
            "fps": args.fps, "visemes": list(VISEMES), "arkit_names": list(ARKIT_NAMES),
            "viseme_track": anim.viseme_track(), "viseme_weights": anim.visemes.round(4).tolist(),
            "blendshapes": anim.blendshapes.round(4).tolist(),
            "head_pose": anim.head_pose.round(4).tolist(),
            "mouth_open_100hz": opening.round(4).tolist(),
        }))  # fmt: skip
        print(f"wrote {args.out}")
    if args.mp4:
        from avatar.animation.video import write_mp4
        from clients.frames import draw_face

        frames = draw_face(anim.blendshapes, anim.head_pose)
        write_mp4(args.mp4, frames, args.fps, audio, rate)
        print(f"wrote {args.mp4}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
