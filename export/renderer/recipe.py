"""Renderer export: `networks.face2d.Face2D` -> ONNX with a dynamic batch axis, verified.

    python -m export.renderer --report      # frames/s of the ONNX model at batch 1 and 16
    python -m export.renderer --sheet out.png --text "Maybe a big problem, please."

Inputs `blendshapes` [batch, 52] float32 (ARKit order) and `head_pose` [batch, 3] float32
(yaw, pitch, roll in radians); output `frames` [batch, 256, 256, 3] uint8 RGB.
"""

from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from export.common import (
    ArtifactRecipe,
    Tolerance,
    ToleranceError,
    compare_outputs,
    ensure,
    onnx_session,
    torch_to_onnx,
    worst,
)
from export.onnx_edit import set_output_dims
from export.sidecar import Sidecar, TensorSpec

log = logging.getLogger(__name__)

SIZE = 256
OPSET = 17
INPUTS = ("blendshapes", "head_pose")
OUTPUT = "frames"
# uint8 frames: ORT and torch may round a soft edge differently by one level.
TOLERANCES = {OUTPUT: Tolerance(atol=2.0)}
MAX_DIFFERING_PIXELS = 1e-3  # fraction of values allowed to differ at all
VERIFY_BATCHES = ((1, 11), (5, 12), (16, 13))  # (batch, seed): not the traced batch of 2


def example_inputs(batch: int, seed: int) -> dict[str, np.ndarray]:
    """Plausible random blendshapes [batch, 52] (sparse, 0..1) and head poses [batch, 3]."""
    rng = np.random.default_rng(seed)
    shapes = rng.uniform(0, 1, size=(batch, 52)) * (rng.uniform(size=(batch, 52)) < 0.3)
    pose = rng.uniform(-0.1, 0.1, size=(batch, 3))
    return {"blendshapes": shapes.astype(np.float32), "head_pose": pose.astype(np.float32)}


def reference(inputs: dict[str, np.ndarray], size: int = SIZE) -> dict[str, np.ndarray]:
    """Run the torch renderer: the reference the ONNX file is checked against."""
    import torch

    from networks.face2d import Face2D

    model = Face2D(size).eval()
    with torch.no_grad():
        frames = model(*(torch.from_numpy(inputs[name]) for name in INPUTS))
    return {OUTPUT: frames.numpy()}


class RendererRecipe(ArtifactRecipe):
    """Face2D -> model.onnx (+ sidecar), checked against torch on unseen batch sizes."""

    name = "renderer"
    code_files = (
        Path(__file__).parents[2] / "networks" / "face2d.py",
        Path(__file__).parents[1] / "onnx_edit.py",
    )

    def __init__(self, size: int = SIZE):
        self.size = size

    def key_inputs(self) -> dict[str, str]:
        import torch

        return {"size": str(self.size), "opset": str(OPSET), "torch": torch.__version__}

    def build(self, out_dir: Path) -> Sidecar:
        import torch

        from networks.face2d import Face2D

        trace = example_inputs(2, seed=0)
        path = torch_to_onnx(
            Face2D(self.size).eval(),
            [torch.from_numpy(trace[name]) for name in INPUTS],
            Path(out_dir) / "model.onnx",
            inputs=INPUTS,
            outputs=[OUTPUT],
            opset=OPSET,
        )
        set_output_dims(path, {OUTPUT: ["batch", self.size, self.size, 3]})
        comparisons = verify(path, lambda x: reference(x, self.size)[OUTPUT], MAX_DIFFERING_PIXELS)
        return self.sidecar(
            path,
            opset=OPSET,
            source={},  # drawn from code only: the code checksums are in the cache key
            validation={"outputs": worst(comparisons), "batches": [b for b, _ in VERIFY_BATCHES]},
            notes=[f"{self.size}x{self.size} RGB uint8; blendshapes in ARKit-52 order"],
        )


def verify(
    path: Path, reference: Callable[[dict[str, np.ndarray]], np.ndarray], max_differing: float = 1.0
) -> list:
    """Compare the face renderer's ONNX file with its torch `reference` (inputs -> frames) on
    VERIFY_BATCHES, which it was not traced with; raise on a mismatch, or where more than
    `max_differing` of the values differ at all. Both renderers (cartoon and portrait)."""
    session = onnx_session(path)
    comparisons = []
    for batch, seed in VERIFY_BATCHES:
        inputs = example_inputs(batch, seed)
        expected, (got,) = reference(inputs), session.run([OUTPUT], inputs)
        context = f"batch {batch}, seed {seed}"
        comparisons += compare_outputs({OUTPUT: expected}, {OUTPUT: got}, TOLERANCES, context)
        differing = float(np.mean(expected != got))
        if differing > max_differing:
            raise ToleranceError(f"{OUTPUT}: {differing:.2%} of values differ ({context})")
    return comparisons


def expected_specs(size: int = SIZE) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """The I/O the export must have (names, dtypes, dims) - what config.pbtxt declares."""
    return (
        [TensorSpec("blendshapes", "float32", ("batch", 52)),
         TensorSpec("head_pose", "float32", ("batch", 3))],
        [TensorSpec(OUTPUT, "uint8", ("batch", size, size, 3))],
    )  # fmt: skip


def measure(path: Path, batches: tuple[int, ...] = (1, 16), seconds: float = 3.0, threads=1):
    """Frames/s of the ONNX renderer per batch size on this CPU -> {batch: fps}."""
    session = onnx_session(path, threads=threads)
    results = {}
    for batch in batches:
        inputs = example_inputs(batch, seed=batch)
        session.run([OUTPUT], inputs)  # warm-up
        runs, started = 0, time.perf_counter()
        while time.perf_counter() - started < seconds:
            session.run([OUTPUT], inputs)
            runs += 1
        results[batch] = runs * batch / (time.perf_counter() - started)
    return results


def main(argv: list[str] | None = None) -> None:
    from avatar.animation import AnimationConfig, animate
    from avatar.animation.timing import phonemize, synthetic_timings
    from avatar.animation.video import contact_sheet, write_png

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--report", action="store_true", help="measure frames/s at batch 1, 16")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--sheet", type=Path, help="write a PNG contact sheet of --text")
    parser.add_argument("--text", default="Maybe a big problem, please.")
    parser.add_argument("--fps", type=float, default=25.0)
    parser.add_argument("--emotion", default="neutral")
    parser.add_argument("--intensity", type=float, default=0.0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    folder = ensure(RendererRecipe())
    log.info("renderer artifact: %s", folder)
    if args.report:
        for batch, fps in measure(folder / "model.onnx", threads=args.threads).items():
            log.info("renderer %dx%d, batch %2d, %d thread(s): %.1f frames/s", SIZE, SIZE,
                     batch, args.threads, fps)  # fmt: skip
    if args.sheet:
        config = AnimationConfig(fps=args.fps, emotion=args.emotion, intensity=args.intensity)
        anim = animate(synthetic_timings(phonemize(args.text)), config, text=args.text)
        session = onnx_session(folder / "model.onnx")
        (frames,) = session.run([OUTPUT], {"blendshapes": anim.blendshapes,
                                           "head_pose": anim.head_pose})  # fmt: skip
        write_png(args.sheet, contact_sheet(frames, columns=10))
        for seg in anim.segments:
            log.info("%5.2f-%5.2f s  frames %3d-%3d  %-3s %s", seg.start, seg.end,
                     int(np.ceil(seg.start * args.fps)), int(np.ceil(seg.end * args.fps)) - 1,
                     seg.viseme, seg.symbols)  # fmt: skip
        log.info("contact sheet (10 frames a row, %g fps): %s", args.fps, args.sheet)
