"""What a spoken turn costs, stage by stage, and how long each stage's requests queue
(`python -m perf turn-cost`).

Paced sessions speak questions through the live protocol (perf/latency.py's speakers:
32-ms frames at real-time pace, a gateway with today's flags); around each run the
command reads

- Triton's metrics per model (`nv_inference_request_success`, `..._queue_duration_us`,
  `..._compute_infer_duration_us`, `..._exec_count`, `..._request_failure`): requests per
  turn, queue and compute milliseconds per request;
- the CPU time (user + system, /proc) of every process of the server: one python-backend
  stub per model instance (named by its model folder) and tritonserver itself, and of the
  gateway: CPU-seconds per turn per model;
- the `asr` model's own counters per pass kind (`avatar_asr_pass_seconds_total{pass=}`:
  its executions' seconds split by the rows' audio, avatar/triton/metrics.PassCost), which
  split the ASR models' CPU into live captions, the pass at a pause and the avatar's own
  final pass.

Settings run one after another on one server, each through its own gateway:
`today` (the defaults) and `before` (copies `asr_before` without the priority levels and
`avatar_before` with `speak_ahead_s` 0: every later sentence to TTS at once), and
`no_captions` (today's, the gateway without passes while the user speaks). Results:
build/perf/turn_cost/ (CSV, JSON, markdown).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import os
import shutil
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import numpy as np

from avatar.endpointing import END_SILENCE_S
from evals.report import DEFAULT_OUT, write_rows
from gateway.process import running_gateway
from perf.harness import serve
from perf.latency import TurnRow, _gateway_options, run_level
from serving.gauges import Sample, metrics, summed_by

log = logging.getLogger(__name__)
OUT = DEFAULT_OUT / "turn_cost"
SETTINGS = ("before", "today", "no_captions")
STUB = "triton_python_backend_stub"
TICK = os.sysconf("SC_CLK_TCK")
# the stages of a turn: which models' CPU each is (a setting's copies count as their model)
STAGES: dict[str, tuple[str, ...]] = {
    "vad": ("vad",),
    "turn detector": ("turn_detector",),
    "asr": ("asr", "asr_encoder", "asr_decoder"),  # split by pass kind below
    "llm (prefill + steps)": ("llm", "llm_decoder"),
    "tts": ("tts", "tts_vits"),
    "emotion": ("emotion_encoder",),
    "lipsync": ("lipsync",),
    "avatar (orchestration, animation)": ("avatar",),
    "triton core (gRPC, schedulers)": ("tritonserver",),
    "gateway": ("gateway",),
}
PASSES = ("caption", "pause", "final")
QUEUED = ("vad", "turn_detector", "asr", "asr_encoder", "asr_decoder", "llm_decoder")
QUEUED += ("tts_vits", "emotion_encoder", "lipsync")


# ---------------------------------------------------------------------- measurements
def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime


def _cmdline(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")


def process_cpu(server_pid: int | None, gateway_pid: int | None) -> dict[str, float]:
    """CPU-seconds so far per model (its python-backend stubs, named by the model folder
    of their model.py), of tritonserver (`tritonserver`) and of the gateway (`gateway`)."""
    cpu: dict[str, float] = defaultdict(float)
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        try:
            command = _cmdline(pid)
            if pid == server_pid:
                cpu["tritonserver"] += _cpu_s(pid)
            elif pid == gateway_pid:
                cpu["gateway"] += _cpu_s(pid)
            elif command and command[0].endswith(STUB) and len(command) > 1:
                cpu[Path(command[1]).parts[-3]] += _cpu_s(pid)  # <repo>/<model>/1/model.py
        except (OSError, IndexError, ValueError):  # ended meanwhile
            continue
    return dict(cpu)


@dataclasses.dataclass
class Snapshot:
    metrics: dict[Sample, float]
    cpu: dict[str, float]
    at: float

    @classmethod
    def take(cls, metrics_url: str, server_pid: int | None, gateway_pid: int | None):
        return cls(
            metrics(metrics_url, None), process_cpu(server_pid, gateway_pid), time.monotonic()
        )


def model_of(name: str, suffix: str) -> str:
    """A setting's copy (`asr_before`) counts as its model (`asr`)."""
    return name[: -len(suffix)] if suffix and name.endswith(suffix) else name


def _delta(after: dict[str, float], before: dict[str, float], suffix: str) -> dict[str, float]:
    out: dict[str, float] = defaultdict(float)
    for name, value in after.items():
        out[model_of(name, suffix)] += value - before.get(name, 0.0)
    return dict(out)


def cost_rows(
    first: Snapshot, last: Snapshot, turns: int, *, sessions: int, setting: str, suffix: str
) -> tuple[list[dict], list[dict]]:
    """(stage cost rows, model queue rows) of one run between two snapshots."""
    cpu = _delta(last.cpu, first.cpu, suffix)

    def metric(name: str, key: str = "model") -> dict[str, float]:
        return _delta(
            summed_by(last.metrics, name, key), summed_by(first.metrics, name, key), suffix
        )

    success = metric("nv_inference_request_success")
    queue_us = metric("nv_inference_queue_duration_us")
    compute_us = metric("nv_inference_compute_infer_duration_us")
    executions = metric("nv_inference_exec_count")
    failures = metric("nv_inference_request_failure")
    pass_s = metric("avatar_asr_pass_seconds_total", "pass")
    passes = metric("avatar_asr_passes_total", "pass")
    wall_s = last.at - first.at
    per_turn = max(turns, 1)
    costs = []
    for stage, models in STAGES.items():
        seconds = sum(cpu.get(m, 0.0) for m in models)
        if stage == "asr":
            total = sum(pass_s.get(k, 0.0) for k in PASSES)
            for kind in PASSES:
                share = pass_s.get(kind, 0.0) / total if total else 0.0
                kind_s = seconds * share
                costs.append(
                    _cost(
                        sessions,
                        setting,
                        f"asr: {kind} passes",
                        kind_s,
                        turns=per_turn,
                        wall_s=wall_s,
                    )
                    | {"requests_per_turn": round(passes.get(kind, 0.0) / per_turn, 2)}
                )
            continue
        costs.append(_cost(sessions, setting, stage, seconds, turns=per_turn, wall_s=wall_s))
    whole = sum(cpu.values())
    costs.append(_cost(sessions, setting, "all", whole, turns=per_turn, wall_s=wall_s))
    queues = []
    for model in QUEUED:
        n = success.get(model, 0.0)
        queues.append(
            {
                "sessions": sessions,
                "setting": setting,
                "model": model,
                "requests_per_turn": round(n / per_turn, 2),
                "queue_ms": round(queue_us.get(model, 0.0) / n / 1000, 2) if n else None,
                "compute_ms": round(compute_us.get(model, 0.0) / n / 1000, 2) if n else None,
                "batch": round(n / executions[model], 2) if executions.get(model) else None,
                "failed": int(failures.get(model, 0.0)),
            }
        )
    return costs, queues


def _cost(sessions: int, setting: str, stage: str, seconds: float, *, turns: int, wall_s: float):
    return {
        "sessions": sessions,
        "setting": setting,
        "stage": stage,
        "cpu_s_per_turn": round(seconds / turns, 3),
        "cores_busy": round(seconds / wall_s, 2) if wall_s else None,
        "requests_per_turn": None,  # the ASR passes' own count
    }


# ---------------------------------------------------------------------- the settings
def copy_model(
    repository: Path,
    name: str,
    suffix: str,
    params: dict[str, str],
    edit: Callable[[object], None] = lambda config: None,
) -> None:
    """A copy `<name><suffix>` of a materialised model with `params` set and `edit`ed."""
    from google.protobuf import text_format

    from model_configs.pbtxt import parse_config

    source, target = repository / name, repository / f"{name}{suffix}"
    shutil.copytree(source, target, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
    config = parse_config(target / "config.pbtxt")
    config.name = target.name
    for key, value in params.items():
        config.parameters[key].string_value = value
    edit(config)
    (target / "config.pbtxt").write_text(text_format.MessageToString(config))


def _no_priorities(config) -> None:
    batching = config.dynamic_batching
    batching.ClearField("priority_levels")
    batching.ClearField("default_priority_level")
    batching.ClearField("priority_queue_policy")


def add_before(repository: Path) -> None:
    """The models of `before`: no priority levels in asr, every later sentence to TTS at
    once (the defaults before this change)."""
    copy_model(repository, "asr", "_before", {}, _no_priorities)
    copy_model(repository, "avatar", "_before", {"speak_ahead_s": "0", "asr_model": "asr_before"})


def gateway_options(setting: str, end_silence_s: float) -> list[str]:
    options = _gateway_options("today", end_silence_s)
    if setting == "before":
        options += ["--model", "avatar_before", "--asr-model", "asr_before"]
    elif setting == "no_captions":
        options += ["--no-partials"]
    return options


# ---------------------------------------------------------------------- report
def first_audio(rows: list[TurnRow]) -> dict:
    values = [r.first_audio for r in rows if not r.error and r.first_audio is not None]
    stalls = [r.stall for r in rows if not r.error and r.stall is not None]
    pct = (lambda q: round(float(np.percentile(values, q)))) if values else (lambda q: None)
    return {
        "turns": len(rows),
        "failed": sum(bool(r.error) for r in rows),
        "first_audio_p50_ms": pct(50),
        "first_audio_p95_ms": pct(95),
        "stall_ms_total": round(sum(stalls)),
    }


def markdown(runs: list[dict], costs: list[dict], queues: list[dict]) -> str:
    keys = [(r["sessions"], r["setting"]) for r in runs]
    head = " | ".join(f"{s} s. {name}" for s, name in keys)
    lines = ["| | " + head + " |", "|---|" + "---:|" * len(keys)]
    for field in ("turns", "failed", "first_audio_p50_ms", "first_audio_p95_ms", "stall_ms_total"):
        lines.append(f"| {field} | " + " | ".join(str(r[field]) for r in runs) + " |")
    lines += ["", "CPU-seconds per turn (cores busy):", "", "| stage | " + head + " |"]
    lines.append("|---|" + "---:|" * len(keys))
    by = {(c["sessions"], c["setting"], c["stage"]): c for c in costs}
    for stage in dict.fromkeys(c["stage"] for c in costs):
        cells = [by.get((s, name, stage)) for s, name in keys]
        lines.append(
            f"| {stage} | "
            + " | ".join(
                "-" if c is None else f"{c['cpu_s_per_turn']:.2f} ({c['cores_busy']})"
                for c in cells
            )
            + " |"
        )
    lines += ["", "Queue ms per request (requests per turn):", "", "| model | " + head + " |"]
    lines.append("|---|" + "---:|" * len(keys))
    byq = {(q["sessions"], q["setting"], q["model"]): q for q in queues}
    for model in QUEUED:
        cells = [byq.get((s, name, model)) for s, name in keys]
        if not any(c and c["requests_per_turn"] for c in cells):
            continue
        lines.append(
            f"| {model} | "
            + " | ".join(
                "-"
                if not c or c["queue_ms"] is None
                else f"{c['queue_ms']:.1f} ({c['requests_per_turn']})"
                for c in cells
            )
            + " |"
        )
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sessions", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--settings", nargs="+", choices=SETTINGS, default=["before", "today"])
    parser.add_argument("--questions", type=int, default=4, help="per session and setting")
    parser.add_argument(
        "--end-silence-s", type=float, default=END_SILENCE_S, help="endpointer silence"
    )
    parser.add_argument("--pause-s", type=float, default=1.0, help="pause after each turn")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.set_defaults(func=command)


def command(args: argparse.Namespace) -> int:
    configure = add_before if "before" in args.settings else None
    runs: list[dict] = []
    costs: list[dict] = []
    queues: list[dict] = []
    all_rows: list[TurnRow] = []
    with contextlib.ExitStack() as stack:
        target = stack.enter_context(serve(configure=configure))
        server_pid = target.server.pid if target.server is not None else None
        gateways = {
            setting: stack.enter_context(
                running_gateway(
                    target.grpc_url, gateway_options(setting, args.end_silence_s), quiet=True
                )
            )
            for setting in args.settings
        }
        # untimed: ONNX Runtime's first runs, the first sessions' caches
        warm = next(iter(args.settings))
        run_level({warm: _ws(gateways[warm][0])}, 1, 1, pause_s=0.0)
        for sessions in args.sessions:
            for setting in args.settings:
                base, process = gateways[setting]
                suffix = "_before" if setting == "before" else ""
                log.info("%d session(s), %s: %d questions each", sessions, setting, args.questions)
                first = Snapshot.take(target.metrics_url, server_pid, process.pid)
                rows = run_level(
                    {setting: _ws(base)}, sessions, args.questions, pause_s=args.pause_s
                )
                last = Snapshot.take(target.metrics_url, server_pid, process.pid)
                done = sum(not r.error for r in rows)
                c, q = cost_rows(
                    first, last, done, sessions=sessions, setting=setting, suffix=suffix
                )
                costs += c
                queues += q
                runs.append({"sessions": sessions, "setting": setting, **first_audio(rows)})
                all_rows += rows
    table = markdown(runs, costs, queues)
    print(table)
    meta = {"end_silence_s": args.end_silence_s, "pause_s": args.pause_s, "stages": STAGES}
    write_rows(all_rows, args.out / "turns", meta)
    write_rows(runs, args.out / "runs", meta)
    write_rows(costs, args.out / "costs", meta)
    write_rows(queues, args.out / "queues", meta)
    (args.out / "turn_cost.md").write_text(table + "\n")
    print(f"saved under {args.out}")
    return 1 if any(r["failed"] for r in runs) else 0


def _ws(base: str) -> str:
    return base.replace("http://", "ws://") + "/ws"
