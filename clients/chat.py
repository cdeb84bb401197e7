"""A spoken question (WAV) -> the avatar's streamed answer, saved as WAV + MP4 + JSON.

python -m clients.chat --url 127.0.0.1:8001 question.wav --out build/chat

Prints each streamed response as it arrives, the time to first audio and first frame
(client side) and the server's per-stage timings.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from avatar.audio import read_wav, resample
from clients.avatar_stream import stream_turn
from clients.say import finish, progress

log = logging.getLogger(__name__)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="clients.chat", description=__doc__.split("\n")[0])
    parser.add_argument("wav", type=Path, help="16-bit PCM WAV, any rate (resampled to 16 kHz)")
    parser.add_argument("--url", default="127.0.0.1:8001")
    parser.add_argument("--out", type=Path, default=Path("build/chat"))
    parser.add_argument("--session", default="chat")
    parser.add_argument("--controls", default="{}", help='JSON, e.g. {"max_tokens": 48}')
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    audio, rate = read_wav(args.wav)
    turn = stream_turn(
        args.url,
        audio=resample(audio, rate, 16000),
        session_id=args.session,
        controls=json.loads(args.controls),
        on_response=progress,
    )
    return finish(turn, args.out)


if __name__ == "__main__":
    sys.exit(main())
