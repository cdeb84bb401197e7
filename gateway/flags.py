"""The gateway's own settings as command-line flags (who may use it, its limits, how its
sessions listen): on `python -m gateway`, and on `avatar serve --web`, which passes on the
ones given to it (`forwarded`). Defaults are Limits' and SessionOptions'."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from gateway.endpointing import STRATEGIES
from gateway.limits import Limits, default_capacity
from gateway.options import SessionOptions

ORIGINS_ENV = "AVATAR_GATEWAY_ORIGINS"
HOSTS_ENV = "AVATAR_GATEWAY_HOSTS"


def add_gateway_arguments(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> list:
    """The gateway's own settings (who may use it, its limits, its sessions' behaviour):
    on `python -m gateway` and on `avatar serve --web`, which forwards them (`forwarded`).
    Returns the actions added."""
    added = []

    def add(*names: str, **kwargs) -> None:
        added.append(parser.add_argument(*names, **kwargs))

    add(
        "--allowed-hosts",
        default=os.environ.get(HOSTS_ENV, ""),
        help="comma-separated host names the gateway answers to (.example.com: and its "
        "subdomains; * any, only behind a proxy that checks Host); always localhost and IP "
        f"addresses, and the hosts of --origins (default ${HOSTS_ENV})",
    )
    add(
        "--origins",
        default=os.environ.get(ORIGINS_ENV, ""),
        help="comma-separated origins whose pages may use the gateway, besides its own "
        f"(default ${ORIGINS_ENV})",
    )
    add(
        "--no-local-origins",
        action="store_true",
        help="do not admit pages on localhost/127.0.0.1 (any port) by default",
    )
    add(
        "--personas",
        type=Path,
        help='JSON {"name": "persona text", ...}: the personas a web client may choose by name',
    )
    add(
        "--allow-persona-text",
        action="store_true",
        help="let web clients send free persona text (by default only the operator key may)",
    )
    limits = Limits()
    for name, help_ in [
        ("max_connections", "open connections in all"),
        ("max_per_address", "open connections per client address"),
        (
            "max_sessions",
            "sessions answered at once; one more is told busy (default: the "
            f"machine's, {default_capacity()} here)",
        ),
        ("messages_per_s", "messages a second per connection (beyond a burst)"),
        ("audio_speed", "microphone audio, times real time, since the connection opened"),
        ("audio_burst_s", "seconds of microphone audio a new connection may send at once"),
        ("backlog_s", "how many seconds behind the gateway may read a client at its pace"),
        ("connects_per_s", "new connections a second per client address (beyond a burst)"),
        ("idle_timeout_s", "close a connection that sent no message for this long"),
        ("first_message_s", "close a connection that sent no message this long after opening"),
    ]:
        value = getattr(limits, name)
        add(
            "--" + name.replace("_", "-"),
            type=type(value) if value is not None else int,
            default=value,
            help=help_,
        )
    add(
        "--max-utterance-s",
        type=float,
        default=SessionOptions.max_utterance_s,
        help="an utterance this long is cut and not answered",
    )
    add(
        "--end-silence-s",
        type=float,
        default=SessionOptions.end_silence_s,
        help="silence that ends an utterance",
    )
    add(
        "--endpointing",
        choices=STRATEGIES,
        default=SessionOptions.endpointing,
        help="model: the end-of-turn model (turn_detector) asked at short pauses ends a "
        "complete turn at once and lets an unfinished one pause longer; silence: "
        "--end-silence-s of silence ends every turn",
    )
    add(
        "--turn-complete-at",
        type=float,
        default=SessionOptions.turn_complete_at,
        help="the model's probability at which a turn is complete",
    )
    add(
        "--turn-incomplete-silence-s",
        type=float,
        default=SessionOptions.turn_incomplete_silence_s,
        help="the silence that ends a turn the model called incomplete",
    )
    add(
        "--speculate-after-s",
        type=float,
        default=SessionOptions.speculate_after_s,
        help="start ASR at a pause this long, before the end of speech is confirmed",
    )
    add("--no-speculate", action="store_true", help="the avatar model transcribes each turn")
    add(
        "--speculate-turn",
        action="store_true",
        help="at that pause also start the reply (in a fork of the conversation), held until "
        "the end of speech is confirmed",
    )
    add(
        "--partial-every-s",
        type=float,
        default=SessionOptions.partial_every_s,
        help="while the user speaks, transcribe the speech so far every this many seconds "
        "(what two passes agree on is where the transcript at the pause starts)",
    )
    add("--no-partials", action="store_true", help="no transcription while the user speaks")
    add(
        "--partials-max-answering",
        type=int,
        default=SessionOptions.partial_max_answering or -1,
        help="no transcription while the user speaks while more than this many replies are "
        "being generated in this gateway (-1, the default: no such limit)",
    )
    add(
        "--passes-alongside",
        action="store_true",
        help="let the passes while speaking run alongside a pass at a pause (by default that "
        "pass cancels them and none starts until it is done)",
    )
    add(
        "--detect-language-s",
        type=float,
        default=SessionOptions.detect_language_s,
        help="until a session's language is known, its passes while speaking wait for this "
        "much speech (Whisper guesses the language of one second badly)",
    )
    return added


def forwarded(args: argparse.Namespace, actions: list) -> list[str]:
    """The command line of `actions` (add_gateway_arguments') whose values `args` changed
    from their defaults: what `avatar serve --web` passes on to the gateway it starts."""
    argv: list[str] = []
    for action in actions:
        value = getattr(args, action.dest)
        if value == action.default:
            continue
        option = action.option_strings[0]
        if isinstance(action, argparse._StoreTrueAction):
            argv.append(option)
        else:
            argv += [option, str(value)]
    return argv
