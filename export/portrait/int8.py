"""Whether INT8 earns a place in the renderers: measured, not shipped.

    python -m export.portrait.int8      # quantise, compare with FP32, time side by side

The portrait renderer's only quantisable layers are its four MatMuls: three map the 52
blendshapes to vertex offsets ([52, 1746] each: the face and the two warp layers), and one
spreads the vertices' displacements over the 4-px grid of the warp ([8448, 582] barycentric
weights, 23 MB of the 29 MB file). Everything else is Gather, GridSample and elementwise
arithmetic on pixel coordinates. Static Q/DQ (`export.quantize`, per-channel INT8 weights,
UINT8 activations, MinMax) calibrated on the animation of CALIBRATION_TEXT; judged on the
replies of evals/portrait_quality.py and 16 random blendshape sets it never saw:
- pixels: the largest difference from FP32 and the share over MAX_LEVELS levels (the
  renderer's own verification allows 2 levels between ONNX Runtime and PyTorch);
- SSIM (grayscale, 7x7 windows) per frame, at least MIN_SSIM;
- speed, FP32 and INT8 alternated in one run, batch 1 and 8, 1 thread.

The cartoon `renderer` (networks/face2d.py) has no MatMul, Gemm or Conv at all: it draws
signed-distance shapes with elementwise ops, so there is nothing for Q/DQ to quantise.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
from pathlib import Path

import numpy as np

from evals.frames import ssim
from evals.gate import side_by_side, timed_ms
from export.common import ensure, onnx_session
from export.quantize import quantize_qdq

log = logging.getLogger(__name__)

CALIBRATION_TEXT = "Good morning! I hope you slept well, shall we plan the day?"
MAX_LEVELS = 3
MAX_SHARE = 1e-3  # of pixels over MAX_LEVELS (evals/portrait_quality.py's bound)
MIN_SSIM = 0.99
RUNS = 10


@dataclasses.dataclass(frozen=True)
class Candidate:
    name: str
    nodes: tuple[str, ...]  # MatMul node names to quantise


CANDIDATES = (
    Candidate("all MatMuls", ("/MatMul", "/MatMul_1", "/MatMul_2", "/MatMul_3")),
    Candidate("blendshape MatMuls only", ("/MatMul", "/MatMul_1", "/MatMul_2")),
)


def evaluation_inputs() -> dict[str, np.ndarray]:
    """The quality replies' frames and 16 random blendshape sets, as one batch of inputs."""
    from evals.portrait_quality import RANDOM_SETS, TEXTS, synthetic_reply
    from export.portrait.recipe import example_inputs

    shapes = [synthetic_reply(text).animation.blendshapes for text in TEXTS]
    random = example_inputs(RANDOM_SETS, seed=2024)
    blendshapes = np.concatenate([*shapes, random["blendshapes"]]).astype(np.float32)
    poses = np.zeros((len(blendshapes), 3), np.float32)
    poses[-RANDOM_SETS:] = random["head_pose"]
    return {"blendshapes": blendshapes, "head_pose": poses}


def compare(fp32: np.ndarray, int8: np.ndarray) -> dict:
    diff = np.abs(fp32.astype(np.int16) - int8.astype(np.int16))
    scores = [ssim(a, b) for a, b in zip(fp32, int8, strict=True)]
    share = float((diff > MAX_LEVELS).mean())
    worst = min(scores)
    failures = []
    if share > MAX_SHARE:
        failures.append(f"{share:.2%} of pixels over {MAX_LEVELS} levels (at most {MAX_SHARE:.1%})")
    if worst < MIN_SSIM:
        failures.append(f"lowest SSIM {worst:.4f} < {MIN_SSIM}")
    return {
        "frames": len(fp32),
        "max_levels": int(diff.max()),
        "share_over_max_levels": round(share, 5),
        "ssim_min": round(worst, 4),
        "ssim_mean": round(float(np.mean(scores)), 4),
        "passes_gate": not failures,
        "why": "; ".join(failures) or "within the bounds",
    }


def measure(folder: Path, out: Path) -> list[dict]:
    """One row per candidate: its pixel figures against FP32 and its speed."""
    from evals.portrait_quality import render, synthetic_reply

    source = folder / "model.onnx"
    calibration = synthetic_reply(CALIBRATION_TEXT).animation.blendshapes.astype(np.float32)
    feeds = [
        {"blendshapes": calibration[i : i + 8], "head_pose": np.zeros((8, 3), np.float32)}
        for i in range(0, len(calibration) - 7, 8)
    ]
    inputs = evaluation_inputs()
    fp32_session = onnx_session(source, threads=1)
    reference = render(fp32_session, inputs["blendshapes"], inputs["head_pose"])
    rows = []
    for candidate in CANDIDATES:
        path = out / f"portrait.{candidate.name.replace(' ', '-')}.int8.onnx"
        quantize_qdq(
            source, path, iter(feeds), ops=["MatMul"], nodes=candidate.nodes, symmetric=False
        )
        session = onnx_session(path, threads=1)
        row = {"candidate": candidate.name, "mb": round(path.stat().st_size / 1e6, 1)}
        row |= compare(reference, render(session, inputs["blendshapes"], inputs["head_pose"]))
        sessions = {"fp32": fp32_session, "int8": session}

        def call_ms(name: str, batch: int, sessions=sessions) -> float:
            feed = {k: v[:batch] for k, v in inputs.items()}
            return timed_ms(lambda: sessions[name].run(None, feed))

        row["speed_1_thread"] = side_by_side(call_ms, rounds=RUNS, warmup=True)
        log.info("%s", row)
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> None:
    from evals.report import DEFAULT_OUT
    from export.portrait.recipe import PortraitRecipe

    parser = argparse.ArgumentParser(prog="python -m export.portrait.int8", description=__doc__)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT / "portrait_int8")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    args.out.mkdir(parents=True, exist_ok=True)
    rows = measure(ensure(PortraitRecipe()), args.out)
    (args.out / "portrait_int8.json").write_text(json.dumps(rows, indent=1))
    print(f"portrait renderer, INT8 Q/DQ vs FP32 ({rows[0]['frames']} frames; bounds: at most "
          f"{MAX_SHARE:.1%} of pixels over {MAX_LEVELS} levels, SSIM >= {MIN_SSIM})")  # fmt: skip
    print(f"{'candidate':>24} {'MB':>5} {'max':>4} {'>3 lv':>7} {'SSIM min':>8} {'gate':>5} "
          f"{'b1 ms fp32/int8':>16} {'b8 ms fp32/int8':>16}")  # fmt: skip
    for r in rows:
        b1, b8 = r["speed_1_thread"]["batch_1"], r["speed_1_thread"]["batch_8"]
        print(
            f"{r['candidate']:>24} {r['mb']:5.1f} {r['max_levels']:4d} "
            f"{r['share_over_max_levels']:7.2%} {r['ssim_min']:8.4f} "
            f"{'pass' if r['passes_gate'] else 'FAIL':>5} "
            f"{b1['fp32_ms']:7.1f}/{b1['int8_ms']:<7.1f} {b8['fp32_ms']:7.1f}/{b8['int8_ms']:<7.1f}"
        )
    print(f"wrote {args.out / 'portrait_int8.json'}")


if __name__ == "__main__":
    main()
