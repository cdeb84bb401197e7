"""A spoken question (WAV or microphone) -> the avatar's streamed answer, saved as WAV +
MP4 + JSON and optionally played.

python -m clients.chat --url 127.0.0.1:8001 question.wav --out build/chat
python -m clients.chat --url 127.0.0.1:8001 --mic --play   # talk; Ctrl-C ends

Prints each streamed response as it arrives, the time to first audio and first frame
(client side) and the server's per-stage timings. With --mic, each utterance (its end
found by the served `vad` model) is one turn of the same session.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

import numpy as np

from avatar.audio import read_wav, resample
from avatar.conversation_tokens import NEW_SESSION
from avatar.vad import SAMPLE_RATE
from clients.avatar_stream import api_key_headers, stream_turn
from clients.microphone import Speaker, listen, microphone_chunks
from clients.say import finish, progress

log = logging.getLogger(__name__)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="clients.chat", description=__doc__.split("\n")[0])
    parser.add_argument(
        "wav", type=Path, nargs="?", help="16-bit PCM WAV, any rate (resampled to 16 kHz)"
    )
    parser.add_argument("--mic", action="store_true", help="listen to the microphone instead")
    parser.add_argument("--play", action="store_true", help="play the reply as it streams")
    parser.add_argument("--url", default="127.0.0.1:8001")
    parser.add_argument("--out", type=Path, default=Path("build/chat"))
    parser.add_argument(
        "--session",
        default=NEW_SESSION,
        help='"new" (a conversation of its own; later --mic turns continue it), a session '
        'token a turn returned, or "" for no memory',
    )
    parser.add_argument("--controls", default="{}", help='JSON, e.g. {"max_tokens": 48}')
    args = parser.parse_args(argv)
    if (args.wav is None) == (not args.mic):
        parser.error("give a WAV file or --mic")
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        speaker = Speaker() if args.play else None
        source = microphone_chunks() if args.mic else None
    except RuntimeError as error:  # no audio library or device
        log.error("%s", error)
        return 2

    session = [args.session]  # the token the server returns replaces "new"
    headers = api_key_headers()

    def turn(audio: np.ndarray, out: Path) -> int:
        def on_response(response: dict) -> None:
            progress(response)
            if speaker is not None:
                speaker.on_response(response)

        result = stream_turn(
            args.url,
            audio=audio,
            session_id=session[0],
            controls=json.loads(args.controls),
            on_response=on_response,
            headers=headers,
        )
        session[0] = result.session_id or session[0]
        return finish(result, out)

    try:
        if args.wav is not None:
            audio, rate = read_wav(args.wav)
            return turn(resample(audio, rate, SAMPLE_RATE), args.out)
        return _conversation(args.url, source, turn, args.out)
    finally:
        if speaker is not None:
            speaker.close()


def _conversation(url: str, source, turn, out: Path) -> int:
    """Microphone turns until Ctrl-C; each reply goes to out/turn-N."""
    number = 0
    try:
        while True:
            sys.stdout.write("listening...\n")
            sys.stdout.flush()
            utterance = listen(url, source)
            if utterance is None:
                return 0
            number += 1
            turn(utterance, out / f"turn-{number}")
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())
