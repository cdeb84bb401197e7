"""`python -m broadcast --triton-url HOST:8001 --url rtmp://...`: go on air against a running
Triton (`avatar broadcast` starts the embedded one itself). Secrets come from the environment
(broadcast/onair.py says which)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys

from avatar.credentials import API_KEY_ENV, KEY_HEADER, read_secret
from broadcast.onair import BroadcastError, add_broadcast_arguments, on_air, settings_from_args
from gateway.triton_client import TritonAccess

log = logging.getLogger("broadcast")


def command_line() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m broadcast", description=__doc__)
    parser.add_argument("--triton-url", default="127.0.0.1:8001", help="Triton gRPC address")
    parser.add_argument(
        "--triton-key-header",
        default=KEY_HEADER,
        help=f"Triton's API key header (the key: ${API_KEY_ENV} or ${API_KEY_ENV}_FILE)",
    )
    parser.add_argument("--triton-ca", help="PEM root certificate: gRPC to Triton over TLS")
    add_broadcast_arguments(parser)
    return parser


def run_until_signalled(settings, triton_url: str, access: TritonAccess) -> int:
    """Broadcast until SIGINT/SIGTERM; 0, or 1 with the reason logged."""

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        await on_air(settings, triton_url, access, stop)

    try:
        asyncio.run(main())
    except BroadcastError as error:
        log.error("%s", error)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    args = command_line().parse_args(argv)
    if not args.url:
        command_line().error("--url is required: where to go on air (rtmp://host/app/stream)")
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        settings = settings_from_args(args)
        access = TritonAccess(read_secret(API_KEY_ENV), args.triton_key_header, args.triton_ca)
    except ValueError as error:
        log.error("%s", error)
        return 2
    return run_until_signalled(settings, args.triton_url, access)


if __name__ == "__main__":
    sys.exit(main())
