"""`python -m perf.soak --minutes N`: the demo load on the `avatar` model for N minutes
(several concurrent clients, turns alternating text and spoken questions) while the
resident memory of tritonserver and of every python-backend stub is sampled from /proc.

Prints failures, turn latency, and per process the memory first/last/max and its trend
(least-squares slope in MB/min over the whole run and over its second half, after the
warm-up); --out saves the samples as JSON. Starts its own embedded server (every model).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from perf import probe

log = logging.getLogger("perf.soak")


def spoken_questions(count: int = 3) -> list[np.ndarray]:
    from avatar.audio import reference_speech

    silence = np.zeros(4000, np.float32)
    return [
        np.concatenate([silence, reference_speech(q), silence]) for q in probe.QUESTIONS[:count]
    ]


def sample_memory(pid: int, every_s: float, stop: threading.Event, out: list) -> None:
    started = time.monotonic()
    while True:
        out.append((time.monotonic() - started, probe.memory(pid)))
        if stop.wait(every_s):
            out.append((time.monotonic() - started, probe.memory(pid)))
            return


def trend(samples: list[tuple[float, dict[str, float]]]) -> list[dict]:
    names = sorted({n for _, s in samples for n in s}, key=lambda n: (n != "tritonserver", n))
    rows = []
    for name in [*names, "total"]:
        times = [t for t, s in samples if name in s or name == "total"]
        values = [sum(s.values()) if name == "total" else s[name] for _, s in samples
                  if name in s or name == "total"]  # fmt: skip
        half = len(times) // 2
        rows.append({
            "process": name,
            "first MB": values[0],
            "last MB": values[-1],
            "max MB": max(values),
            "slope MB/min": probe.slope_per_minute(times, values),
            "2nd-half slope MB/min": probe.slope_per_minute(times[half:], values[half:]),
        })  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m perf.soak", description=__doc__)
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--clients", type=int, default=3, help="concurrent turns")
    parser.add_argument("--audio-every", type=int, default=2, help="every k-th turn is spoken")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--sample-s", type=float, default=10.0, help="memory sampling period")
    parser.add_argument("--out", type=Path, help="save samples and outcomes as JSON")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")

    from avatar.deployment import build_repository
    from avatar.server import EmbeddedServer, ServerOptions
    from perf.overload import format_rows

    questions = spoken_questions()
    controls = {"max_tokens": args.max_tokens, "seed": 5}
    with tempfile.TemporaryDirectory(prefix="soak-") as tmp:
        build_repository(Path(tmp) / "repository", "embedded")
        with EmbeddedServer(
            ServerOptions(Path(tmp) / "repository", startup_timeout_s=600)
        ) as server:
            assert server.pid is not None
            url = server.grpc_url

            def run(index: int) -> probe.Outcome:
                spoken = args.audio_every and index % args.audio_every == 0
                audio = questions[index % len(questions)] if spoken else None
                return probe.turn(url, index, audio, **controls)

            samples: list = []
            stop = threading.Event()
            sampler = threading.Thread(
                target=sample_memory, args=(server.pid, args.sample_s, stop, samples)
            )
            sampler.start()
            log.info("soak: %d clients for %.1f min", args.clients, args.minutes)
            outcomes = probe.closed_loop(args.clients, args.minutes * 60, run)
            stop.set()
            sampler.join()
            gauges = probe.metrics(server.metrics_url)
            alive = server.is_running()

    failed = [o for o in outcomes if o.error]
    for outcome in failed:
        log.warning("failed %s turn: %s", outcome.kind, outcome.error[:300])
    served = [o.seconds for o in outcomes if not o.error]
    first_audio = [o.first_audio_s for o in outcomes if not o.error and o.first_audio_s]
    spoken = sum(o.kind == "audio" for o in outcomes)
    print(
        f"soak {args.minutes:g} min, {args.clients} clients: {len(outcomes)} turns "
        f"({spoken} spoken, {len(outcomes) - spoken} text), {len(failed)} failed; "
        f"server alive at the end: {alive}"
    )
    print(
        f"turn p50 {probe.percentile(served, 50):.2f} s, p99 {probe.percentile(served, 99):.2f} s;"
        f" first audio p50 {probe.percentile(first_audio, 50):.2f} s, "
        f"p99 {probe.percentile(first_audio, 99):.2f} s"
    )
    in_flight = {k[1]: v for k, v in gauges.items() if k[0] == "avatar_active"}
    print(f"gauges after the load: {in_flight}")
    print(f"memory ({len(samples)} samples every {args.sample_s:g} s):")
    print(format_rows(trend(samples)))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(
            json.dumps(
                {
                    "samples": samples,
                    "outcomes": [o.__dict__ for o in outcomes],
                    "gauges": {str(k): v for k, v in gauges.items()},
                },
                indent=1,
            )
        )
    return 0 if not failed and alive else 1


if __name__ == "__main__":
    sys.exit(main())
