"""`python -m perf sweep`: perf_analyzer concurrency sweeps, saved as CSV, printed as a table.

Against a running server (`--url`), or against an embedded server it starts itself.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
import tempfile
from pathlib import Path

from perf.analyzer import format_table, input_data_file, sweep, write_csv
from perf.inputs import SAMPLES

log = logging.getLogger("perf")
RESULTS = Path(__file__).resolve().parent / "results"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m perf", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("sweep", help="concurrency sweep of one or more models")
    run.add_argument("--url", help="gRPC address of a running server (default: start one)")
    run.add_argument("--models", nargs="+", default=sorted(SAMPLES), choices=sorted(SAMPLES))
    run.add_argument("--concurrency", nargs="+", type=int, default=[1, 2, 4, 8])
    run.add_argument("--measurement-ms", type=int, default=3000)
    run.add_argument(
        "--stability", type=float, default=10.0, help="perf_analyzer --stability-percentage"
    )
    run.add_argument("--out", type=Path, default=RESULTS, help="folder for <model>.csv")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )

    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="perf-")))
        url = args.url
        if url is None:
            from avatar.deployment import build_repository
            from avatar.server import EmbeddedServer, ServerOptions

            build_repository(tmp / "repository", "embedded", args.models)
            url = stack.enter_context(EmbeddedServer(ServerOptions(tmp / "repository"))).grpc_url
        all_points = []
        for model in args.models:
            data = input_data_file(SAMPLES[model](), tmp)
            points = sweep(
                url,
                model,
                args.concurrency,
                data,
                args.measurement_ms,
                stability_percent=args.stability,
            )
            path = write_csv(points, args.out / f"{model}.csv")
            log.info("%s: %d points saved to %s", model, len(points), path)
            all_points += points
    sys.stdout.write(format_table(all_points) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
