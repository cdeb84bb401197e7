"""`python -m gateway --triton-url HOST:8001`: the live gateway against a running Triton.

Secrets come from the environment, never from flags (`ps` shows argv): the operator key
$AVATAR_GATEWAY_KEY (or a file named by $AVATAR_GATEWAY_KEY_FILE), Triton's API key
$AVATAR_API_KEY (or $AVATAR_API_KEY_FILE), the session secret $AVATAR_SESSION_SECRET (or
$AVATAR_SESSION_SECRET_FILE)."""

from __future__ import annotations

import argparse
import dataclasses
import logging
from pathlib import Path

from avatar.credentials import API_KEY_ENV, KEY_HEADER, read_secret
from gateway.access import Hosts, Origins
from gateway.app import Edge, run, ssl_context
from gateway.flags import add_gateway_arguments, session_options
from gateway.limits import Limits
from gateway.options import SessionOptions
from gateway.triton_client import TritonAccess

log = logging.getLogger("gateway")


def command_line() -> argparse.ArgumentParser:
    """The command line; every session default is SessionOptions', every limit Limits'."""
    parser = argparse.ArgumentParser(prog="python -m gateway", description=__doc__)
    parser.add_argument("--triton-url", default="127.0.0.1:8001", help="Triton gRPC address")
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to bind (0.0.0.0: every interface)"
    )
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--tls-cert", type=Path, help="PEM certificate: serve https and wss")
    parser.add_argument("--tls-key", type=Path, help="PEM private key of --tls-cert")
    parser.add_argument(
        "--triton-key-header",
        default=KEY_HEADER,
        help=f"Triton's API key header (the key: ${API_KEY_ENV} or ${API_KEY_ENV}_FILE)",
    )
    parser.add_argument("--triton-ca", help="PEM root certificate: gRPC to Triton over TLS")
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
    add_gateway_arguments(parser)
    return parser


def edge(args: argparse.Namespace) -> Edge:
    limits = Limits(
        **{
            f.name: getattr(args, f.name)
            for f in dataclasses.fields(Limits)
            if hasattr(args, f.name)
        }
    )
    allowed = tuple(o.strip().rstrip("/") for o in args.origins.split(",") if o.strip())
    hosts = Hosts.of(args.allowed_hosts, allowed, args.host)
    if args.host in ("0.0.0.0", "::") and not args.allowed_hosts:
        log.warning(
            "listening on every interface: pages are served to localhost, IP addresses and "
            "the hosts of --origins only; name the others with --allowed-hosts"
        )
    origins = Origins(allowed, local=not args.no_local_origins)
    return Edge.from_environment(limits, origins, hosts=hosts)


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
        session_options(args, model=args.model, asr_model=args.asr_model),
        args.host,
        args.port,
        portrait=args.portrait,
        edge=edge(args),
        triton_access=triton_access(args),
        tls=ssl_context(args.tls_cert, args.tls_key),
    )


if __name__ == "__main__":
    main()
