"""`python -m gateway --triton-url HOST:8001`: the live gateway against a running Triton.

Secrets come from the environment, never from flags (`ps` shows argv): the operator key
$AVATAR_GATEWAY_KEY (or a file named by $AVATAR_GATEWAY_KEY_FILE), Triton's API key
$AVATAR_API_KEY (or $AVATAR_API_KEY_FILE), the session secret $AVATAR_SESSION_SECRET (or
$AVATAR_SESSION_SECRET_FILE)."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
from pathlib import Path

from avatar.credentials import API_KEY_ENV, KEY_HEADER, read_secret
from gateway.access import Origins
from gateway.app import Edge, run, ssl_context
from gateway.endpointing import STRATEGIES
from gateway.limits import Limits
from gateway.options import SessionOptions, load_personas
from gateway.triton_client import TritonAccess

ORIGINS_ENV = "AVATAR_GATEWAY_ORIGINS"


def command_line() -> argparse.ArgumentParser:
    """The command line; every session default is SessionOptions'."""
    parser = argparse.ArgumentParser(prog="python -m gateway", description=__doc__)
    parser.add_argument("--triton-url", default="127.0.0.1:8001", help="Triton gRPC address")
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to bind (0.0.0.0: every interface)"
    )
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--tls-cert", type=Path, help="PEM certificate: serve https and wss")
    parser.add_argument("--tls-key", type=Path, help="PEM private key of --tls-cert")
    parser.add_argument(
        "--origins",
        default=os.environ.get(ORIGINS_ENV, ""),
        help="comma-separated origins whose pages may use the gateway, besides its own "
        f"(default ${ORIGINS_ENV})",
    )
    parser.add_argument(
        "--no-local-origins",
        action="store_true",
        help="do not admit pages on localhost/127.0.0.1 (any port) by default",
    )
    parser.add_argument(
        "--personas",
        type=Path,
        help='JSON {"name": "persona text", ...}: the personas a web client may choose by name',
    )
    parser.add_argument(
        "--allow-persona-text",
        action="store_true",
        help="let web clients send free persona text (by default only the operator key may)",
    )
    parser.add_argument(
        "--triton-key-header",
        default=KEY_HEADER,
        help=f"Triton's API key header (the key: ${API_KEY_ENV} or ${API_KEY_ENV}_FILE)",
    )
    parser.add_argument("--triton-ca", help="PEM root certificate: gRPC to Triton over TLS")
    limits = Limits()
    for name, help_ in [
        ("max_connections", "open connections in all"),
        ("max_per_address", "open connections per client address"),
        ("messages_per_s", "messages a second per connection (beyond a burst)"),
        ("audio_speed", "microphone audio, times real time (beyond a burst)"),
        ("audio_burst_s", "seconds of microphone audio a connection may send at once"),
        ("connects_per_s", "new connections a second per client address (beyond a burst)"),
        ("idle_timeout_s", "close a connection that sent nothing for this long"),
    ]:
        value = getattr(limits, name)
        parser.add_argument(
            "--" + name.replace("_", "-"), type=type(value), default=value, help=help_
        )
    parser.add_argument(
        "--max-utterance-s",
        type=float,
        default=SessionOptions.max_utterance_s,
        help="an utterance this long is cut and not answered",
    )
    parser.add_argument(
        "--end-silence-s",
        type=float,
        default=SessionOptions.end_silence_s,
        help="silence that ends an utterance",
    )
    parser.add_argument(
        "--endpointing",
        choices=STRATEGIES,
        default=SessionOptions.endpointing,
        help="model: the end-of-turn model (turn_detector) asked at short pauses ends a "
        "complete turn at once and lets an unfinished one pause longer; silence: "
        "--end-silence-s of silence ends every turn",
    )
    parser.add_argument(
        "--turn-complete-at",
        type=float,
        default=SessionOptions.turn_complete_at,
        help="the model's probability at which a turn is complete",
    )
    parser.add_argument(
        "--turn-incomplete-silence-s",
        type=float,
        default=SessionOptions.turn_incomplete_silence_s,
        help="the silence that ends a turn the model called incomplete",
    )
    parser.add_argument(
        "--speculate-after-s",
        type=float,
        default=SessionOptions.speculate_after_s,
        help="start ASR at a pause this long, before the end of speech is confirmed",
    )
    parser.add_argument(
        "--no-speculate", action="store_true", help="the avatar model transcribes each turn"
    )
    parser.add_argument(
        "--speculate-turn",
        action="store_true",
        help="at that pause also start the reply (in a fork of the conversation), held until "
        "the end of speech is confirmed",
    )
    parser.add_argument(
        "--partial-every-s",
        type=float,
        default=SessionOptions.partial_every_s,
        help="while the user speaks, transcribe the speech so far every this many seconds "
        "(what two passes agree on is where the transcript at the pause starts)",
    )
    parser.add_argument(
        "--no-partials", action="store_true", help="no transcription while the user speaks"
    )
    parser.add_argument(
        "--partials-max-answering",
        type=int,
        default=SessionOptions.partial_max_answering or -1,
        help="no transcription while the user speaks while more than this many replies are "
        "being generated in this gateway (-1, the default: no such limit)",
    )
    parser.add_argument(
        "--passes-alongside",
        action="store_true",
        help="let the passes while speaking run alongside a pass at a pause (by default that "
        "pass cancels them and none starts until it is done)",
    )
    parser.add_argument(
        "--detect-language-s",
        type=float,
        default=SessionOptions.detect_language_s,
        help="until a session's language is known, its passes while speaking wait for this "
        "much speech (Whisper guesses the language of one second badly)",
    )
    parser.add_argument("--model", default=SessionOptions.model, help="the turn model (decoupled)")
    parser.add_argument(
        "--asr-model", default=SessionOptions.asr_model, help="the speculative transcripts' model"
    )
    parser.add_argument(
        "--portrait",
        type=Path,
        help="a portrait rig folder (rig.json + photo.png): the page draws that photo with "
        "WebGL; without it, a cartoon face",
    )
    parser.add_argument(
        "--log-level",
        default="INFO",
        choices=["DEBUG", "INFO", "WARNING"],
        help="DEBUG: every ASR pass and its time",
    )
    return parser


def session_options(args: argparse.Namespace) -> SessionOptions:
    return SessionOptions(
        end_silence_s=args.end_silence_s,
        endpointing=args.endpointing,
        turn_complete_at=args.turn_complete_at,
        turn_incomplete_silence_s=args.turn_incomplete_silence_s,
        speculate_after_s=None if args.no_speculate else args.speculate_after_s,
        speculate_turn=args.speculate_turn and not args.no_speculate,
        partial_every_s=None if args.no_partials or args.no_speculate else args.partial_every_s,
        detect_language_s=args.detect_language_s,
        pause_first=not args.passes_alongside,
        partial_max_answering=(
            None if args.partials_max_answering < 0 else args.partials_max_answering
        ),
        model=args.model,
        asr_model=args.asr_model,
        max_utterance_s=args.max_utterance_s,
        personas=load_personas(args.personas),
        allow_persona_text=args.allow_persona_text,
    )


def edge(args: argparse.Namespace) -> Edge:
    limits = Limits(
        **{
            f.name: getattr(args, f.name)
            for f in dataclasses.fields(Limits)
            if hasattr(args, f.name)
        }
    )
    allowed = tuple(o.strip().rstrip("/") for o in args.origins.split(",") if o.strip())
    return Edge.from_environment(limits, Origins(allowed, local=not args.no_local_origins))


def triton_access(args: argparse.Namespace) -> TritonAccess:
    key = read_secret(API_KEY_ENV)
    return TritonAccess(key, args.triton_key_header, args.triton_ca)


def main(argv: list[str] | None = None) -> None:
    args = command_line().parse_args(argv)
    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    run(
        args.triton_url,
        session_options(args),
        args.host,
        args.port,
        portrait=args.portrait,
        edge=edge(args),
        triton_access=triton_access(args),
        tls=ssl_context(args.tls_cert, args.tls_key),
    )


if __name__ == "__main__":
    main()
