"""Client-side probes for the reliability commands and tests: the python-backend gauges on
/metrics, the memory of tritonserver and its stub processes (/proc), config overrides in a
materialised repository, and a closed-loop driver of `avatar` turns.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from avatar.model_io import ASR, infer_inputs
from perf.harness import concurrently
from serving.gauges import gauge, metrics
from serving.supervisor import stub_processes

__all__ = ["gauge", "metrics"]  # read here by perf and the tests


def refused(values: dict, model: str, reason: str = "busy") -> float:
    return values.get(("avatar_refused_total", (("model", model), ("reason", reason))), 0.0)


# ---------------------------------------------------------------- processes and memory
def rss_mb(pid: int) -> float | None:
    """Resident memory of one process (MB), None when it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def stub_pids(server_pid: int) -> dict[str, int]:
    """model -> pid of its (first) live python-backend stub."""
    return {model: min(pids) for model, pids in stub_processes(server_pid).items()}


def memory(server_pid: int) -> dict[str, float]:
    """RSS (MB) of tritonserver and of each model's stub processes, keyed by name."""
    sample = {"tritonserver": rss_mb(server_pid) or 0.0}
    for model, pids in stub_processes(server_pid).items():
        sample[model] = sum(rss_mb(pid) or 0.0 for pid in pids)
    return sample


def slope_per_minute(times_s: Sequence[float], values: Sequence[float]) -> float:
    """Least-squares slope of values over time, per minute."""
    if len(times_s) < 2:
        return 0.0
    return float(np.polyfit(np.asarray(times_s) / 60.0, np.asarray(values), 1)[0])


# ---------------------------------------------------------------- repository overrides
def set_parameters(repository: Path, model: str, **values: str) -> None:
    """Write `parameters` of a materialised model's config.pbtxt (e.g. max_active_turns)."""
    from google.protobuf import text_format

    from model_configs.pbtxt import parse_config

    path = repository / model / "config.pbtxt"
    config = parse_config(path)
    for key, value in values.items():
        config.parameters[key].string_value = str(value)
    path.write_text(text_format.MessageToString(config))


def set_queue_policy(repository: Path, model: str, max_queue_size: int, timeout_us: int) -> None:
    """Rewrite a batched model's dynamic_batching.default_queue_policy (REJECT on timeout)."""
    from google.protobuf import text_format

    from model_configs.pbtxt import parse_config

    path = repository / model / "config.pbtxt"
    config = parse_config(path)
    policy = config.dynamic_batching.default_queue_policy
    policy.max_queue_size = max_queue_size
    policy.default_timeout_microseconds = timeout_us
    policy.timeout_action = policy.REJECT
    policy.allow_timeout_override = True
    path.write_text(text_format.MessageToString(config))


# ---------------------------------------------------------------- load
QUESTIONS = (
    "What is your name?",
    "Can you tell me where the lobby is?",
    "What time does the restaurant open?",
    "Is there parking near the building?",
    "How do I get to the train station?",
    "What is the weather like today?",
)


@dataclasses.dataclass
class Outcome:
    """One turn as the client saw it."""

    started: float  # monotonic
    seconds: float
    error: str  # "" when served; the stream error or the final error list otherwise
    refused: bool  # refused by admission control / a queue policy
    first_audio_s: float | None = None
    kind: str = "text"


def is_refusal(error: str) -> bool:
    text = error.lower()
    return "server busy" in text or "exceeds maximum queue size" in text


def turn(
    url: str, index: int, audio: np.ndarray | None, timeout_s: float = 300.0, **controls: Any
) -> Outcome:
    """One `avatar` turn: text, or `audio` when given; failures are data, not raises. A
    turn longer than `timeout_s` (or silent for 60 s) is cancelled and fails."""
    from clients.avatar_stream import stream_turn

    started = time.monotonic()
    kind = "audio" if audio is not None else "text"
    try:
        if audio is not None:
            result = stream_turn(url, audio=audio, controls=controls, timeout_s=timeout_s)
        else:
            question = QUESTIONS[index % len(QUESTIONS)]
            result = stream_turn(url, text=question, controls=controls, timeout_s=timeout_s)
    except Exception as error:  # a broken stream, a timeout
        return Outcome(started, time.monotonic() - started, f"{type(error).__name__}: {error}",
                       False, None, kind)  # fmt: skip
    error = result.error
    if not error and result.final:
        errors = result.errors
        error = "; ".join(errors)
    elif not error:
        error = "no final response"
    seconds = time.monotonic() - started
    return Outcome(started, seconds, error, is_refusal(error), result.first_audio_s, kind)


def transcribe(url: str, audio: np.ndarray) -> Outcome:
    """One `asr` request (one gRPC call); failures are data, not raises."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    started = time.monotonic()
    request = ASR.request(audio=np.asarray(audio, np.float32).reshape(-1))
    inputs = infer_inputs(request, grpcclient.InferInput)
    try:
        with grpcclient.InferenceServerClient(url) as client:
            client.infer("asr", inputs, client_timeout=300)
        error = ""
    except InferenceServerException as failure:
        error = str(failure)
    seconds = time.monotonic() - started
    return Outcome(started, seconds, error, is_refusal(error), None, "audio")


def closed_loop(
    clients: int,
    seconds: float,
    run: Callable[[int], Outcome],
    refused_backoff_s: float = 0.25,
    *,
    outcomes: list[Outcome] | None = None,
    stop: threading.Event | None = None,
) -> list[Outcome]:
    """`clients` threads each run turns back to back for `seconds`; a refused client waits
    `refused_backoff_s` (as a client honouring UNAVAILABLE would) before it tries again.
    Outcomes are appended to `outcomes` as they end (so a caller interrupted meanwhile
    still has them); `stop` set ends the load after the turns in flight."""
    outcomes = [] if outcomes is None else outcomes
    lock = threading.Lock()
    deadline = time.monotonic() + seconds
    stop = stop or threading.Event()

    def client(number: int) -> None:
        index = number
        while time.monotonic() < deadline and not stop.is_set():
            outcome = run(index)
            with lock:
                outcomes.append(outcome)
            index += clients
            if outcome.refused:
                time.sleep(refused_backoff_s)

    concurrently(client, clients, daemon=True)
    return outcomes


def spoken_questions(count: int = 3) -> list[np.ndarray]:
    """The first `count` QUESTIONS in the packaged voice, 0.25 s of silence around each."""
    from avatar.audio import reference_speech

    silence = np.zeros(4000, np.float32)
    return [np.concatenate([silence, reference_speech(q), silence]) for q in QUESTIONS[:count]]


def format_rows(rows: list[dict]) -> str:
    """A right-aligned text table of dict rows (floats with 2 decimals)."""
    keys = list(rows[0])
    cells = [[f"{r[k]:.2f}" if isinstance(r[k], float) else str(r[k]) for k in keys] for r in rows]
    widths = [max(len(k), *(len(c[i]) for c in cells)) for i, k in enumerate(keys)]
    lines = ["  ".join(k.rjust(w) for k, w in zip(keys, widths, strict=True))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(lines)
