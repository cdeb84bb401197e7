"""`python -m perf.overload`: drive a model at 1x and at N x its capacity (closed loop)
and print what overload does: how many requests are refused, how fast a refusal comes
back, and the latency of the admitted ones against 1x.

--model avatar (text turns): the server runs with `max_active_turns` = --capacity.
--model asr (spoken questions): its queue policy holds at most --capacity requests
(max_queue_size) besides the batch in progress; 1x load is --capacity clients.
Starts an embedded server (every model of model_repository/), or drives a running one
(--url; its config must then match --capacity). Refused clients wait --backoff seconds
before trying again, as a client that honours UNAVAILABLE would.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from perf import probe
from perf.harness import percentile, serve

log = logging.getLogger("perf.overload")


def summarize(label: str, outcomes: list[probe.Outcome], seconds: float) -> dict[str, float]:
    served = [o.seconds for o in outcomes if not o.error]
    refusals = [o.seconds for o in outcomes if o.refused]
    failed = [o for o in outcomes if o.error and not o.refused]
    first_audio = [o.first_audio_s for o in outcomes if not o.error and o.first_audio_s]
    return {
        "load": label,
        "turns": len(outcomes),
        "served": len(served),
        "served/min": len(served) / seconds * 60,
        "refused": len(refusals),
        "failed": len(failed),
        "refusal p50 ms": percentile(refusals, 50) * 1000,
        "refusal max ms": max(refusals) * 1000 if refusals else float("nan"),
        "served p50 s": percentile(served, 50),
        "served p99 s": percentile(served, 99),
        "first audio p50 s": percentile(first_audio, 50),
        "first audio p99 s": percentile(first_audio, 99),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m perf.overload", description=__doc__)
    parser.add_argument("--url", help="gRPC address of a running server (default: start one)")
    parser.add_argument("--metrics-url", help="its /metrics address (refusal counter)")
    parser.add_argument("--model", choices=("avatar", "asr"), default="avatar")
    parser.add_argument(
        "--capacity", type=int, default=2, help="avatar max_active_turns / asr max_queue_size"
    )
    parser.add_argument("--factor", type=int, default=4, help="overload = factor x capacity")
    parser.add_argument("--seconds", type=float, default=60.0, help="per load level")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--backoff", type=float, default=0.25, help="s a refused client waits")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    controls = {"max_tokens": args.max_tokens, "seed": 1}

    def configure(repository: Path) -> None:
        if args.model == "avatar":
            probe.set_parameters(repository, "avatar", max_active_turns=args.capacity)
        else:
            probe.set_queue_policy(repository, "asr", args.capacity, 30_000_000)

    with serve(args.url, configure=configure, metrics_url=args.metrics_url or "") as target:
        url, metrics_url = target.grpc_url, target.metrics_url
        questions = []
        if args.model == "asr":
            questions = probe.spoken_questions()

        def run(index: int) -> probe.Outcome:
            if args.model == "asr":
                return probe.transcribe(url, questions[index % len(questions)])
            return probe.turn(url, index, None, **controls)

        probe.closed_loop(1, 1.0, run)  # warm-up: caches, first-call costs
        rows = []
        for factor in (1, args.factor):
            clients = factor * args.capacity
            log.info("%dx load: %d clients for %.0f s", factor, clients, args.seconds)
            before = probe.refused(probe.metrics(metrics_url), "avatar") if metrics_url else 0
            outcomes = probe.closed_loop(clients, args.seconds, run, args.backoff)
            row = summarize(f"{factor}x ({clients} clients)", outcomes, args.seconds)
            if metrics_url and args.model == "avatar":
                row["server refused"] = int(
                    probe.refused(probe.metrics(metrics_url), "avatar") - before
                )
            rows.append(row)
            for outcome in outcomes:
                if outcome.error and not outcome.refused:
                    log.warning("failed turn: %s", outcome.error[:200])
    what = "turns" if args.model == "avatar" else "queued requests"
    print(f"{args.model} overload, capacity {args.capacity} {what}, {args.seconds:.0f} s per level")
    print(probe.format_rows(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
