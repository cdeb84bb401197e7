"""`python -m perf.soak --minutes N`: the demo load on the `avatar` model for N minutes
(several concurrent clients, turns alternating text and spoken questions) while the
resident memory of tritonserver and of every python-backend stub is sampled from /proc.

Prints failures, turn latency, and per process the memory first/last/max and its trend
(least-squares slope in MB/min over the whole run, its second half and its last fifth, after the
warm-up); --out saves the samples as JSON. Starts its own embedded server (every model)
with the supervisor on, so that the soak goes on after a stub died and says so.

It always ends with a report (also on Ctrl-C): a turn longer than --turn-timeout-s is
cancelled and counted as failed, every python-backend stub that vanished is named with
the time it was last seen, and the exit status is 1 when anything failed.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from perf import probe
from perf.harness import percentile, serve
from serving.supervisor import stub_processes

log = logging.getLogger("perf.soak")


class Watch:
    """Samples the memory of tritonserver and its stubs every `every_s` and notices stub
    processes that vanished (a death the supervisor then heals by reloading the model)."""

    def __init__(self, server_pid: Callable[[], int | None], every_s: float) -> None:
        # asked at every sample: the supervisor may have restarted the server
        self.server_pid, self.every_s = server_pid, every_s
        self.started = time.monotonic()
        self.samples: list[tuple[float, dict[str, float]]] = []
        self.deaths: list[dict] = []  # {"model", "pid", "last_seen_s", "noticed_s"}
        self._seen: dict[int, tuple[str, float]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="soak-watch", daemon=True)

    def start(self) -> Watch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        while True:
            self.sample()
            if self._stop.wait(self.every_s):
                self.sample()
                return

    def sample(self) -> None:
        now = time.monotonic() - self.started
        pid = self.server_pid() or 0
        self.samples.append((now, probe.memory(pid)))
        alive = {pid: model for model, pids in stub_processes(pid).items() for pid in pids}
        for pid, (model, last_seen) in list(self._seen.items()):
            if pid not in alive:
                death = {"model": model, "pid": pid, "last_seen_s": round(last_seen, 1),
                         "noticed_s": round(now, 1)}  # fmt: skip
                self.deaths.append(death)
                log.error("soak: %s stub (pid %d) vanished after %.0f s", model, pid, last_seen)
                del self._seen[pid]
        for pid, model in alive.items():
            self._seen[pid] = (model, now)


def trend(samples: list[tuple[float, dict[str, float]]]) -> list[dict]:
    names = sorted({n for _, s in samples for n in s}, key=lambda n: (n != "tritonserver", n))
    rows = []
    for name in [*names, "total"]:
        times = [t for t, s in samples if name in s or name == "total"]
        values = [sum(s.values()) if name == "total" else s[name] for _, s in samples
                  if name in s or name == "total"]  # fmt: skip
        half = len(times) // 2
        # the last fifth: caches and allocator arenas grow to their high-water mark (longer
        # sessions, longer prompts) and then stay; a leak keeps its slope here too
        tail = len(times) - max(2, len(times) // 5)
        rows.append({
            "process": name,
            "first MB": values[0],
            "last MB": values[-1],
            "max MB": max(values),
            "slope MB/min": probe.slope_per_minute(times, values),
            "2nd-half slope MB/min": probe.slope_per_minute(times[half:], values[half:]),
            "last-fifth slope MB/min": probe.slope_per_minute(times[tail:], values[tail:]),
        })  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m perf.soak", description=__doc__)
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--clients", type=int, default=3, help="concurrent turns")
    parser.add_argument("--audio-every", type=int, default=2, help="every k-th turn is spoken")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--sample-s", type=float, default=10.0, help="memory sampling period")
    parser.add_argument(
        "--turn-timeout-s", type=float, default=120.0, help="a longer turn fails (cancelled)"
    )
    parser.add_argument("--out", type=Path, help="save samples and outcomes as JSON")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")

    questions = probe.spoken_questions()
    controls = {"max_tokens": args.max_tokens, "seed": 5}
    run_ = SoakRun()
    outcomes = run_.outcomes
    with serve(heal=True) as target:
        server, url = target.server, target.grpc_url
        assert server is not None and server.pid is not None  # started here, not attached

        def run(index: int) -> probe.Outcome:
            spoken = args.audio_every and index % args.audio_every == 0
            audio = questions[index % len(questions)] if spoken else None
            return probe.turn(url, index, audio, args.turn_timeout_s, **controls)

        watch = run_.watch = Watch(lambda: server.pid, args.sample_s).start()
        stop = threading.Event()
        log.info("soak: %d clients for %.1f min (log %s)", args.clients, args.minutes,
                 server.log_path)  # fmt: skip
        load = threading.Thread(
            target=probe.closed_loop,
            args=(args.clients, args.minutes * 60, run),
            kwargs={"outcomes": outcomes, "stop": stop},
            daemon=True,
        )
        load.start()
        try:
            while load.is_alive():
                load.join(timeout=1.0)
        except KeyboardInterrupt:  # report what ran so far
            run_.interrupted = True
            log.warning("soak: interrupted; waiting for the turns in flight")
            stop.set()
            load.join(timeout=args.turn_timeout_s + 10)
        watch.stop()
        try:
            run_.gauges = probe.metrics(server.metrics_url)
        except OSError as error:
            log.error("soak: no metrics at the end: %s", error)
        run_.alive = server.is_running()
        run_.events = list(server.supervisor.events) if server.supervisor else []
        run_.log_path = server.log_path
    return report(args, run_)


@dataclasses.dataclass
class SoakRun:
    outcomes: list[probe.Outcome] = dataclasses.field(default_factory=list)
    watch: Watch | None = None
    gauges: dict = dataclasses.field(default_factory=dict)
    alive: bool = False
    events: list[str] = dataclasses.field(default_factory=list)
    log_path: Path | None = None
    interrupted: bool = False


def report(args: argparse.Namespace, run: SoakRun) -> int:
    """Print the soak's figures, save them with --out; 1 when anything failed."""
    outcomes, gauges, alive, interrupted = run.outcomes, run.gauges, run.alive, run.interrupted
    events, log_path = run.events, run.log_path
    samples = run.watch.samples if run.watch else []
    deaths = run.watch.deaths if run.watch else []
    failed = [o for o in outcomes if o.error]
    for outcome in failed:
        log.warning("failed %s turn: %s", outcome.kind, outcome.error[:300])
    served = [o.seconds for o in outcomes if not o.error]
    first_audio = [o.first_audio_s for o in outcomes if not o.error and o.first_audio_s]
    spoken = sum(o.kind == "audio" for o in outcomes)
    stuck = sum("stream cancelled" in o.error for o in failed)
    print(
        f"soak {args.minutes:g} min{' (interrupted)' if interrupted else ''}, "
        f"{args.clients} clients: {len(outcomes)} turns ({spoken} spoken, "
        f"{len(outcomes) - spoken} text), {len(failed)} failed ({stuck} stuck, cancelled "
        f"after {args.turn_timeout_s:g} s or 60 s of silence); server alive at the end: {alive}"
    )
    print(f"stub processes that vanished: {len(deaths)} {deaths or ''}")
    if events:
        print(f"supervisor: {events}")
    print(f"server log: {log_path}")
    print(
        f"turn p50 {percentile(served, 50):.2f} s, p99 {percentile(served, 99):.2f} s;"
        f" first audio p50 {percentile(first_audio, 50):.2f} s, "
        f"p99 {percentile(first_audio, 99):.2f} s"
    )
    in_flight = {dict(k[1])["model"] + "/" + dict(k[1])["what"]: v for k, v in gauges.items()
                 if k[0] == "avatar_active"}  # fmt: skip
    print(f"gauges after the load: {in_flight}")
    print(f"memory ({len(samples)} samples every {args.sample_s:g} s):")
    print(probe.format_rows(trend(samples)))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(
            json.dumps(
                {
                    "samples": samples,
                    "outcomes": [o.__dict__ for o in outcomes],
                    "stub_deaths": deaths,
                    "gauges": {str(k): v for k, v in gauges.items()},
                },
                indent=1,
            )
        )
    turns_left = sum(v for k, v in in_flight.items() if k == "avatar/turns")
    ok = outcomes and not failed and not deaths and alive and not turns_left and not interrupted
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
