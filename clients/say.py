"""Text -> the avatar's spoken answer: WAV + MP4 + JSON animation, with live progress.

python -m clients.say --url 127.0.0.1:8001 "Hello, who are you?" --out build/say

Prints the time to first audio and first frame (client side) and the server's
per-stage timings.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from clients.avatar_stream import TurnResult, stream_turn

log = logging.getLogger(__name__)


def progress(response: dict) -> None:
    """One line per streamed response, for the user."""
    kind = response.get("kind")
    if kind == "transcript":
        sys.stdout.write(f"heard:  {response['text']}\n")
    elif kind == "sentence":
        frames = len(response["blendshapes"])
        flag = f"  [{response['error']}]" if response.get("error") else ""
        sys.stdout.write(
            f"  #{response['sentence_index']} @ {response['start_time']:6.2f} s "
            f"({frames} frames): {response['text']}{flag}\n"
        )
    sys.stdout.flush()


def report(turn: TurnResult) -> str:
    def seconds(value: float | None) -> str:
        return "-" if value is None else f"{value * 1000:.0f} ms"

    timings = turn.timings

    def listing(values: dict) -> str:
        return ", ".join(f"{k}={v:.0f}" for k, v in values.items())

    lines = [
        f"time to first audio: {seconds(turn.first_audio_s)} (client side, from sending the "
        "request to the first sentence's audio)",
        f"first frame: {seconds(turn.first_frame_s)} (its ARKit-52 blendshapes, with the "
        f"audio); first rendered video: {seconds(turn.first_video_s)} (the server's pixels, "
        f"after the audio); whole turn: {seconds(turn.total_s)}",
        "server, ms since the request: " + listing(timings.get("since_request_ms", {})),
        "server, ms per stage (summed): " + listing(timings.get("stage_ms", {})),
    ]
    if "llm_stats" in timings:
        lines.append(f"llm: {json.dumps(timings['llm_stats'])}")
    errors = turn.errors
    if errors:
        lines.append(f"errors: {errors}")
    lines.append(f"video: {timings.get('video', '?')}")
    return "\n".join(lines)


def finish(turn: TurnResult, out: Path) -> int:
    """Print the turn's figures and save its files; 1 when the turn failed."""
    if turn.error:
        log.error("%s", turn.error)
        return 1
    sys.stdout.write(report(turn) + "\n")
    for kind, path in save(turn, out).items():
        sys.stdout.write(f"{kind}: {path}\n")
    return 0


def save(turn: TurnResult, out: Path, stem: str = "answer") -> dict[str, Path]:
    """Write <stem>.wav, <stem>.mp4 (audio and frames on the turn clock), <stem>.json."""
    from avatar.animation.video import write_mp4
    from avatar.audio import write_wav
    from clients.frames import draw_face, server_video

    out.mkdir(parents=True, exist_ok=True)
    audio, rate = turn.audio()
    shapes, poses, fps = turn.blendshapes()
    paths = {"wav": write_wav(out / f"{stem}.wav", audio, rate)}
    frames = server_video(turn.sentences, turn.videos, fps, len(shapes))
    if frames is None:
        frames = draw_face(shapes, poses)
    if len(frames):
        paths["mp4"] = write_mp4(out / f"{stem}.mp4", frames, fps, audio, rate)
    animation = {
        "transcript": turn.transcript,
        "reply": turn.final.get("text", ""),
        "fps": fps,
        "sample_rate": rate,
        "arkit_names": _arkit_names(),
        "sentences": [
            {
                "index": s["sentence_index"],
                "text": s["text"],
                "emotion": s.get("emotion", ""),
                "start_time": s["start_time"],
                "duration": s["audio"].size / s["sample_rate"] if s["sample_rate"] else 0.0,
                "error": s.get("error", ""),
                "animation": s.get("animation", {}),
                "blendshapes": s["blendshapes"].round(4).tolist(),
            }
            for s in turn.sentences
        ],
        "timings": turn.timings,
        "client": {"first_audio_s": turn.first_audio_s, "first_frame_s": turn.first_frame_s},
    }
    paths["json"] = out / f"{stem}.json"
    paths["json"].write_text(json.dumps(animation, indent=1))
    return paths


def _arkit_names() -> list[str]:
    from avatar.animation.tables import ARKIT_NAMES

    return list(ARKIT_NAMES)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="clients.say", description=__doc__.split("\n")[0])
    parser.add_argument("text")
    parser.add_argument("--url", default="127.0.0.1:8001")
    parser.add_argument("--out", type=Path, default=Path("build/say"))
    parser.add_argument("--session", default="")
    parser.add_argument("--controls", default="{}", help='JSON, e.g. {"fps": 25}')
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    turn = stream_turn(
        args.url,
        text=args.text,
        session_id=args.session,
        controls=json.loads(args.controls),
        on_response=progress,
    )
    return finish(turn, args.out)


if __name__ == "__main__":
    sys.exit(main())
