"""Portrait renderer export: a photo -> its rig -> `networks.portrait` as ONNX, verified.

    python -m export.portrait                       # the default photo (grace_hopper.jpg)
    python -m export.portrait PHOTO                 # any frontal photo; the server uses it
                                                    # when AVATAR_PORTRAIT=PHOTO is set
    python -m export.portrait --report              # frames/s and latency at batch 1..16
    python -m export.portrait --sheet out.png --video out.mp4 --text "Maybe a big problem."

Inputs `blendshapes` [batch, 52] float32 (ARKit order) and `head_pose` [batch, 3] float32
(yaw, pitch, roll in radians), as the cartoon `renderer`; output `frames`
[batch, 512, 512, 3] uint8 RGB. The artifact folder also holds the rig (rig.npz for the
renderer, rig.json + photo.png for the page's WebGL).
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import time
from pathlib import Path

import numpy as np

from evals import face_landmarks as landmarks
from export.common import ArtifactRecipe, ensure, onnx_session, torch_to_onnx, worst
from export.onnx_edit import set_output_dims
from export.portrait.rig import ARKIT_APPROXIMATIONS, MOUTH_COLORS, SIZE, TEETH_HEIGHT, Rig
from export.renderer.recipe import INPUTS, OUTPUT, VERIFY_BATCHES, example_inputs, verify
from export.sidecar import Sidecar, sha256_file

log = logging.getLogger(__name__)

PHOTO_ENV = "AVATAR_PORTRAIT"
OPSET = 17  # GridSample needs 16
# inputs, output, test inputs and the check against torch: the cartoon renderer's
# (export/renderer/recipe.py); its uint8 tolerance holds here too (a bilinear tap may round a
# level apart: measured max 1)


def default_photo() -> Path:
    """$AVATAR_PORTRAIT, else matplotlib's grace_hopper.jpg (US Navy, public domain)."""
    if os.environ.get(PHOTO_ENV):
        return Path(os.environ[PHOTO_ENV])
    import matplotlib

    return Path(matplotlib.get_data_path()) / "sample_data" / "grace_hopper.jpg"


def load_photo(path: Path) -> np.ndarray:
    from PIL import Image

    if not Path(path).is_file():
        raise FileNotFoundError(f"portrait photo {path} does not exist")
    return np.asarray(Image.open(path).convert("RGB"))


def renderer(rig: Rig, **options):  # -> networks.portrait.PortraitRenderer
    """The torch renderer of a rig (the reference the ONNX file is checked against)."""
    from networks.portrait import PortraitRenderer

    return PortraitRenderer(
        photo=rig.photo,
        vertices=rig.vertices,
        triangles=rig.triangles,
        offsets=rig.offsets,
        layer_offsets=rig.layer_offsets,
        rigidity=rig.rigidity,
        pivot=rig.pivot,
        mouth_upper=landmarks.INNER_UPPER,
        mouth_lower=landmarks.INNER_LOWER,
        mouth_box=rig.mouth_box,
        eye_box=rig.eye_box,
        eye_upper=landmarks.RIGHT_EYE_UPPER + landmarks.LEFT_EYE_UPPER[::-1],  # x ascending
        teeth=TEETH_HEIGHT * rig.unit,
        colors=MOUTH_COLORS,
        **options,
    ).eval()


def run_torch(model, inputs: dict[str, np.ndarray]) -> np.ndarray:
    import torch

    with torch.inference_mode():
        return model(*(torch.from_numpy(inputs[name]) for name in INPUTS)).numpy()


class PortraitRecipe(ArtifactRecipe):
    """Photo -> rig (+ rig.json, photo.png) -> model.onnx (+ sidecar), checked against torch."""

    name = "portrait_renderer"
    code_files = (
        Path(__file__).parent / "rig.py",
        Path(__file__).parents[2] / "evals" / "face_landmarks.py",
        Path(__file__).parents[2] / "networks" / "portrait.py",
        Path(__file__).parents[1] / "onnx_edit.py",
        Path(__file__).parents[1] / "renderer" / "recipe.py",  # its inputs and verification
    )

    def __init__(self, photo: Path | None = None):
        self.photo = Path(photo or default_photo())

    def key_inputs(self) -> dict[str, str]:
        import mediapipe
        import torch

        return {
            "photo": sha256_file(self.photo),
            "size": str(SIZE),
            "opset": str(OPSET),
            "torch": torch.__version__,
            "mediapipe": mediapipe.__version__,
        }

    def build(self, out_dir: Path) -> Sidecar:
        import torch

        from export.portrait.rig import build_rig

        out_dir = Path(out_dir)
        with landmarks.FaceMesh() as mesh:
            rig = build_rig(load_photo(self.photo), mesh)
        rig.save(out_dir)
        model = renderer(rig)
        trace = example_inputs(2, seed=0)
        path = torch_to_onnx(
            model,
            [torch.from_numpy(trace[name]) for name in INPUTS],
            out_dir / "model.onnx",
            inputs=INPUTS,
            outputs=[OUTPUT],
            opset=OPSET,
        )
        set_output_dims(path, {OUTPUT: ["batch", SIZE, SIZE, 3]})
        comparisons = verify(path, lambda inputs: run_torch(model, inputs))
        return self.sidecar(
            path,
            opset=OPSET,
            source={"photo": self.photo.name, "photo_sha256": sha256_file(self.photo)},
            validation={"outputs": worst(comparisons), "batches": [b for b, _ in VERIFY_BATCHES]},
            notes=[
                f"{SIZE}x{SIZE} RGB uint8 of the rigged photo; blendshapes in ARKit-52 order",
                f"rig: {len(rig.vertices)} vertices, {len(rig.triangles)} triangles, "
                f"eye distance {rig.unit:.1f} px, mouth box {list(rig.mouth_box)}",
                *(f"{name}: {how}" for name, how in ARKIT_APPROXIMATIONS.items()),
            ],
        )


def measure(path: Path, batches=(1, 4, 8, 16), seconds: float = 3.0, threads: int = 1):
    """Frames/s and per-call latency (median, p95) of the ONNX renderer on this CPU
    -> {batch: (frames/s, median ms, p95 ms)}."""
    session = onnx_session(path, threads=threads)
    results = {}
    for batch in batches:
        inputs = example_inputs(batch, seed=batch)
        session.run([OUTPUT], inputs)  # warm-up
        times, started = [], time.perf_counter()
        while time.perf_counter() - started < seconds or len(times) < 5:
            t0 = time.perf_counter()
            session.run([OUTPUT], inputs)
            times.append(time.perf_counter() - t0)
        ms = sorted(1000 * t for t in times)
        p95 = ms[min(len(ms) - 1, round(0.95 * (len(ms) - 1)))]
        results[batch] = (batch * len(times) / sum(times), statistics.median(ms), p95)
    return results


def main(argv: list[str] | None = None) -> None:
    from avatar.animation import AnimationConfig, animate
    from avatar.animation.timing import phonemize, synthetic_timings
    from avatar.animation.video import contact_sheet, write_png

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("photo", nargs="?", type=Path, help="a frontal photo (default: "
                        f"${PHOTO_ENV} or matplotlib's grace_hopper.jpg)")  # fmt: skip
    parser.add_argument("--report", action="store_true", help="frames/s at batch 1/4/8/16")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--sheet", type=Path, help="write a PNG contact sheet of --text")
    parser.add_argument("--text", default="Maybe a big problem, please.")
    parser.add_argument("--fps", type=float, default=25.0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    folder = ensure(PortraitRecipe(args.photo))
    log.info("portrait artifact: %s", folder)
    if args.photo and args.photo.resolve() != default_photo().resolve():
        log.info("to serve this portrait: export %s=%s", PHOTO_ENV, args.photo.resolve())
    if args.report:
        log.info("portrait renderer %dx%d, %d thread(s), ONNX Runtime CPU:", SIZE, SIZE,
                 args.threads)  # fmt: skip
        for batch, (fps, median, p95) in measure(folder / "model.onnx",
                                                 threads=args.threads).items():  # fmt: skip
            log.info("  batch %2d: %6.1f frames/s, %7.1f ms per call (p95 %.1f)", batch, fps,
                     median, p95)  # fmt: skip
    if args.sheet:
        anim = animate(synthetic_timings(phonemize(args.text)), AnimationConfig(fps=args.fps),
                       text=args.text)  # fmt: skip
        (frames,) = onnx_session(folder / "model.onnx").run(
            [OUTPUT], {"blendshapes": anim.blendshapes, "head_pose": anim.head_pose}
        )
        write_png(args.sheet, contact_sheet(frames, columns=8))
        log.info("contact sheet (8 frames a row, %g fps): %s", args.fps, args.sheet)
