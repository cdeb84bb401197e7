"""`python -m perf`: perf_analyzer suites, batching sweeps and the naive baseline.

  suite     every public model + the `avatar` stream, concurrency sweep -> build/perf/suite/
  batching  max_batch_size x queue delay x instances per native model -> build/perf/batching/
  baseline  the same turn in-process, no batching, vs the `avatar` stream -> build/perf/baseline/
  sweep     one or more models' concurrency sweep (time windows until stable) -> CSV
  asr-windows  encoder window length vs WER on real speech and time -> build/perf/asr/
  asr-prefix  ASR passes while the user speaks: WER, time left -> build/perf/asr_prefix/
  asr-tiny  Whisper tiny.en vs base for captions: WER, ms -> build/perf/asr_tiny/
  latency   spoken questions in real time, 1/2/4 sessions, today vs release -> build/perf/latency/
  capacity  paced live sessions 1..8, default flags: sessions per machine -> build/perf/capacity/
  endpointing  end-of-speech silence vs questions cut early -> build/perf/endpointing/
  turn-taking  heads cut at each pause, finished-turn delay; dev/test -> build/perf/turn_taking/
  first-piece  first TTS piece at a clause break vs a full stop -> build/perf/first_piece/
  llm-server  LLM tokens/s and ttft through Triton vs in-process -> build/perf/llm_server/
  asr-server  ASR utterances/s and ms through Triton vs in-process -> build/perf/asr_server/
  flood     flood a running gateway while a normal session talks: its latency, the refusals
  failover  2 replicas + HAProxy + Redis + gateway, kill -9 of one mid-conversation
  knowledge  venue questions answered with and without the operator's documents
  says       own name, the user's facts and the documents' facts stated (dev / test)
  turn-cost  CPU-seconds per spoken turn by stage, queue time per model -> build/perf/turn_cost/
  gpu-stages  each network on a GPU, alone and as Triton models chained by BLS via DLPack
  broadcast  on air through nginx-rtmp: chat posted -> answer heard, frame rate, CPU per stream
  long-conversation  one session's first tokens over 30 turns, turns dropped 1 by 1 vs in bulk

Against a running server (`--url`), or an embedded server it starts itself. Results are
CSV + JSON (with the machine's load average: the project machines share 2 cores, so the
figures are noisy) + a markdown table + PNG plots.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
from pathlib import Path

from evals.report import DEFAULT_OUT
from perf.analyzer import format_table, input_data_file, sweep, write_csv
from perf.harness import serve
from perf.inputs import SAMPLES

log = logging.getLogger("perf")
RESULTS = DEFAULT_OUT / "sweep"


def _sweep(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="perf-") as tmp, serve(args.url) as target:
        all_points = []
        for model in args.models:
            data = input_data_file(SAMPLES[model](), Path(tmp))
            points = sweep(
                target.grpc_url,
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


def _suite(args: argparse.Namespace) -> int:
    from perf import suite

    with tempfile.TemporaryDirectory(prefix="perf-suite-") as tmp, serve(args.url) as target:
        results, failures = suite.run(
            target.grpc_url, args.models, args.concurrency, args.requests, Path(tmp)
        )
    paths = suite.save(results, failures, args.out)
    sys.stdout.write(suite.format_table(results, failures) + "\n")
    sys.stdout.write("saved: " + ", ".join(str(p) for p in paths) + "\n")
    return 0


def _batching(args: argparse.Namespace) -> int:
    from evals.report import write_rows
    from perf import batching

    results = batching.run(
        args.models,
        delays_us=args.delays_us,
        instances=args.instances,
        batches=args.batches,
        concurrency=args.concurrency,
        requests=args.requests,
    )
    args.out.mkdir(parents=True, exist_ok=True)
    table = batching.format_table(results)
    csv_path = write_rows(results, args.out / "batching")
    (args.out / "batching.md").write_text(table + "\n")
    plots = batching.plot(results, args.out)
    sys.stdout.write(table + "\n")
    sys.stdout.write(f"saved: {csv_path}, {args.out / 'batching.md'}, {len(plots)} plots\n")
    return 0


def _baseline(args: argparse.Namespace) -> int:
    from perf import baseline

    config = baseline.Scenario(
        sessions=tuple(args.sessions),
        turns=args.turns,
        max_tokens=args.max_tokens,
        render=args.render,
        warmup=args.warmup,
    )
    with serve(args.url) as target:
        results = baseline.run(target.grpc_url, config)
    paths = baseline.save(results, config, args.out)
    sys.stdout.write(baseline.format_table(results) + "\n")
    sys.stdout.write("saved: " + ", ".join(str(p) for p in paths) + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    from perf import batching, suite

    parser = argparse.ArgumentParser(
        prog="python -m perf", description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("sweep", help="concurrency sweep of one or more models")
    run.add_argument("--url", help="gRPC address of a running server (default: start one)")
    run.add_argument("--models", nargs="+", default=["vad", "asr"], choices=sorted(SAMPLES))
    run.add_argument("--concurrency", nargs="+", type=int, default=[1, 2, 4, 8])
    run.add_argument("--measurement-ms", type=int, default=3000)
    run.add_argument(
        "--stability", type=float, default=10.0, help="perf_analyzer --stability-percentage"
    )
    run.add_argument("--out", type=Path, default=RESULTS, help="folder for <model>.csv")
    run.set_defaults(func=_sweep)

    st = sub.add_parser("suite", help="every public model and the avatar stream")
    st.add_argument("--url", help="gRPC address of a running server (default: start one)")
    st.add_argument("--models", nargs="+", default=list(suite.MODELS), choices=suite.MODELS)
    st.add_argument(
        "--concurrency", nargs="+", type=int, help="levels for every model (default per model)"
    )
    st.add_argument("--requests", type=int, help="requests per level (default per model)")
    st.add_argument("--out", type=Path, default=DEFAULT_OUT / "suite")
    st.set_defaults(func=_suite)

    bt = sub.add_parser("batching", help="max_batch_size x queue delay x instances")
    bt.add_argument(
        "--models", nargs="+", default=list(batching.SWEPT), choices=sorted(batching.GRIDS)
    )
    bt.add_argument("--batches", nargs="+", type=int, help="default per model (GRIDS)")
    bt.add_argument("--delays-us", nargs="+", type=int, default=list(batching.DELAYS_US))
    bt.add_argument("--instances", nargs="+", type=int, default=list(batching.INSTANCES))
    bt.add_argument("--concurrency", type=int, help="clients per point (default per model)")
    bt.add_argument("--requests", type=int, help="requests per point (default per model)")
    bt.add_argument("--out", type=Path, default=DEFAULT_OUT / "batching")
    bt.set_defaults(func=_batching)

    bl = sub.add_parser("baseline", help="the same turn in-process (naive) vs the avatar stream")
    bl.add_argument("--url", help="gRPC address of a running server (default: start one)")
    bl.add_argument("--sessions", nargs="+", type=int, default=[1, 2, 4, 8])
    bl.add_argument("--turns", type=int, default=2, help="turns per session")
    bl.add_argument("--max-tokens", type=int, default=48)
    bl.add_argument("--render", action="store_true", help="also render video frames")
    bl.add_argument(
        "--warmup",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="one untimed turn per side first",
    )
    bl.add_argument("--out", type=Path, default=DEFAULT_OUT / "baseline")
    bl.set_defaults(func=_baseline)

    from perf import (
        asr_prefix,
        asr_server,
        asr_tiny,
        asr_windows,
        broadcast,
        capacity,
        endpointing,
        failover,
        first_piece,
        flood,
        knowledge,
        latency,
        llm_server,
        long_conversation,
        says,
        turn_cost,
        turn_taking,
    )
    from perf.gpu_stages import cli as gpu_stages_cli

    asr_windows.add_arguments(
        sub.add_parser("asr-windows", help="ASR window length vs WER on real speech and time")
    )
    asr_prefix.add_arguments(
        sub.add_parser("asr-prefix", help="ASR passes while speaking: WER and time left")
    )
    asr_tiny.add_arguments(
        sub.add_parser("asr-tiny", help="Whisper tiny.en vs base for captions: WER and time")
    )
    latency.add_arguments(
        sub.add_parser("latency", help="spoken turns in real time: where the time goes")
    )
    capacity.add_arguments(
        sub.add_parser("capacity", help="paced live sessions ramped: sessions per machine")
    )
    endpointing.add_arguments(
        sub.add_parser("endpointing", help="end-of-speech silence vs questions cut early")
    )
    turn_taking.add_arguments(
        sub.add_parser("turn-taking", help="end of turn: heads cut at pauses, finished delay")
    )
    first_piece.add_arguments(
        sub.add_parser("first-piece", help="first TTS piece at a clause break vs a full stop")
    )
    long_conversation.add_arguments(
        sub.add_parser("long-conversation", help="first tokens of a long conversation")
    )
    llm_server.add_arguments(
        sub.add_parser("llm-server", help="LLM tokens/s through Triton vs in-process")
    )
    asr_server.add_arguments(
        sub.add_parser("asr-server", help="ASR utterances/s and ms through Triton vs in-process")
    )
    flood.add_arguments(
        sub.add_parser("flood", help="flood a running gateway; a normal session's latency")
    )
    failover.add_arguments(
        sub.add_parser("failover", help="kill -9 a replica mid-conversation: lost, remembered")
    )
    knowledge.add_arguments(
        sub.add_parser("knowledge", help="venue facts stated with and without the documents")
    )
    says.add_arguments(
        sub.add_parser("says", help="own name, the user's facts, the documents' facts stated")
    )
    gpu_stages_cli.add_arguments(
        sub.add_parser("gpu-stages", help="each stage on a GPU, alone and served through BLS")
    )
    turn_cost.add_arguments(
        sub.add_parser("turn-cost", help="CPU-seconds per turn by stage, queue ms per model")
    )
    broadcast.add_arguments(
        sub.add_parser("broadcast", help="on air: chat posted -> answer heard, frames, CPU")
    )

    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
