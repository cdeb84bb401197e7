"""`python -m export.portrait.quality`: the portrait renderer's quality on its artifact
(the checks, their figures and thresholds: evals/portrait_quality.py).

    python -m export.portrait.quality               # 3 replies, Piper's timings and audio
    python -m export.portrait.quality --synthetic   # espeak phonemes, synthetic timings
    python -m export.portrait.quality --text "Bob bought my peppermint bubble gum."

Results: build/perf/portrait/quality.json and quality.md, pictures beside them.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from avatar.animation import AnimationConfig, animate
from evals.portrait_quality import (
    FPS,
    OUT,
    RANDOM_SETS,
    TEXTS,
    Evaluation,
    Reply,
    evaluate,
    markdown,
    synthetic_reply,
    write_pictures,
)
from evals.report import save_results
from export.portrait.recipe import example_inputs
from export.portrait.rig import Rig

log = logging.getLogger(__name__)


def tts_replies(texts: Sequence[str], fps: float = FPS) -> list[Reply]:
    """Piper (the tts_vits artifact under ONNX Runtime): audio and phoneme timings -> the
    animations, as the pipeline makes them. Builds the artifact when it is not cached."""
    from avatar.tts import Controls, Phonemizer, Synthesizer, onnx_infer, packaged_voice
    from avatar.tts.synth import joined
    from export.common import ensure, onnx_session
    from export.tts.recipe import VitsRecipe

    voice = packaged_voice()
    session = onnx_session(ensure(VitsRecipe()) / "model.onnx")
    synth = Synthesizer(Phonemizer(voice.config), onnx_infer(session))
    replies = []
    for text in texts:
        pieces = list(synth.stream(text, Controls.defaults(voice.config)))
        whole = joined(pieces, text)
        timings = list(zip(whole.phonemes, whole.starts.tolist(), whole.ends.tolist(), strict=True))
        duration = sum(p.audio.size / p.sample_rate for p in pieces)
        anim = animate(timings, AnimationConfig(fps=fps), text=text, duration=duration)
        replies.append(Reply(text, anim, whole.audio, whole.sample_rate))
    return replies


def measure(
    folder_or_session: Path | str | Any,
    texts: Sequence[str] = TEXTS,
    *,
    rig: Rig | None = None,
    fps: float = FPS,
    tts: bool = False,
    threads: int = 1,
) -> dict[str, Any]:
    """Render `texts` as spoken replies and measure them -> results (evals.portrait_quality);
    results["checks"][name] = {"value", "limit", "ok"}. Given a session, pass its `rig`."""
    evaluation, _ = _evaluate(folder_or_session, texts, rig=rig, fps=fps, tts=tts, threads=threads)
    return evaluation.results


def _evaluate(
    folder_or_session: Path | str | Any,
    texts: Sequence[str],
    *,
    rig: Rig | None,
    fps: float,
    tts: bool,
    threads: int,
) -> tuple[Evaluation, list[Reply]]:
    from export.common import onnx_session

    if isinstance(folder_or_session, (str, Path)):
        folder = Path(folder_or_session)
        session = onnx_session(folder / "model.onnx", threads=threads)
        rig = rig or Rig.load(folder)
    elif rig is None:
        raise ValueError("measure(session): pass the session's rig (Rig.load(folder))")
    else:
        session = folder_or_session
    replies = tts_replies(texts, fps) if tts else [synthetic_reply(t, fps) for t in texts]
    random_shapes = example_inputs(RANDOM_SETS, seed=7)["blendshapes"]
    evaluation = evaluate(session, rig, replies, random_shapes)
    evaluation.results.update(timings="tts" if tts else "synthetic", fps=fps)
    return evaluation, replies


def main(argv: list[str] | None = None) -> None:
    from export.common import ensure
    from export.portrait.recipe import PortraitRecipe

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("photo", nargs="?", type=Path, help="a frontal photo (default: the "
                        "served portrait)")  # fmt: skip
    parser.add_argument("--text", action="append", help="a reply to speak (repeatable; "
                        "default: three, two with p/b/m)")  # fmt: skip
    parser.add_argument("--synthetic", action="store_true", help="espeak's phonemes, "
                        "synthetic timings, instead of the TTS's (a silent MP4)")  # fmt: skip
    parser.add_argument("--fps", type=float, default=FPS)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    level = logging.DEBUG if args.verbose else logging.INFO
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    folder = ensure(PortraitRecipe(args.photo))
    log.info("portrait artifact: %s", folder)
    evaluation, replies = _evaluate(folder, args.text or TEXTS, rig=None, fps=args.fps,
                                    tts=not args.synthetic, threads=args.threads)  # fmt: skip
    results = evaluation.results
    results["artifact"] = str(folder)
    args.out.mkdir(parents=True, exist_ok=True)
    write_pictures(args.out, evaluation, Rig.load(folder), replies[0])
    save_results(args.out, "quality", results, markdown(results))
    failed = [name for name, c in results["checks"].items() if not c["ok"]]
    if failed:
        log.warning("not met: %s", ", ".join(failed))


if __name__ == "__main__":
    main()
