"""The gateway's own settings as command-line flags (who may use it, its limits, how its
sessions listen): on `python -m gateway`, and on `avatar serve --web`, which passes on the
ones given to it (`forwarded`). Defaults are Limits' and SessionOptions'."""

from __future__ import annotations

import argparse
import dataclasses
import os
from pathlib import Path

from gateway.limits import Limits, default_capacity
from gateway.options import SessionOptions, load_personas

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
            _option(name),
            type=type(value) if value is not None else int,
            default=value,
            help=help_,
        )
    for field in session_flags():
        added += _session_flag(parser, field)
    return added


def session_flags() -> list[dataclasses.Field]:
    """SessionOptions' fields that are flags (made with gateway.options.flag)."""
    return [f for f in dataclasses.fields(SessionOptions) if "help" in f.metadata]


def _option(name: str) -> str:
    return "--" + name.replace("_", "-")


def _session_flag(parser, field: dataclasses.Field) -> list:
    """The flag (and its `off` flag) of one SessionOptions field."""
    meta = dict(field.metadata)
    help_, off, negated = meta.pop("help"), meta.pop("off", None), meta.pop("negated", None)
    name = meta.pop("name", _option(field.name))
    if isinstance(field.default, bool):
        if negated:  # a setting on by default: its flag turns it off
            return [parser.add_argument(negated, dest=field.name, action="store_false", help=help_)]
        return [parser.add_argument(name, dest=field.name, action="store_true", help=help_)]
    meta.setdefault("type", type(field.default))
    added = [parser.add_argument(name, dest=field.name, default=field.default, help=help_, **meta)]
    if off:
        flag, what = off
        added.append(parser.add_argument(flag, dest=_off(field), action="store_true", help=what))
    return added


def _off(field: dataclasses.Field) -> str:
    return f"{field.name}_off"


def session_options(args: argparse.Namespace, **more) -> SessionOptions:
    """SessionOptions from the flags `add_gateway_arguments` added (`more`: fields that are
    not flags of the gateway, e.g. the models' names)."""
    values = {
        f.name: None if getattr(args, _off(f), False) else getattr(args, f.name)
        for f in session_flags()
    }
    if values["speculate_after_s"] is None:  # no pass at the pause: nothing to start from
        values.update(speculate_turn=False, speculate_held=False, partial_every_s=None)
    return SessionOptions(**values, personas=load_personas(args.personas), **more)


def forwarded(args: argparse.Namespace, actions: list) -> list[str]:
    """The command line of `actions` (add_gateway_arguments') whose values `args` changed
    from their defaults: what `avatar serve --web` passes on to the gateway it starts."""
    argv: list[str] = []
    for action in actions:
        value = getattr(args, action.dest)
        if value == action.default:
            continue
        option = action.option_strings[0]
        if isinstance(action, argparse._StoreConstAction):  # store_true, store_false
            argv.append(option)
        else:
            argv += [option, str(value)]
    return argv
