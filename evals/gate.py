"""What every INT8 gate reports: its verdict (passes or not, and why), and the variant's
speed beside FP32's, timed alternately in one run. The gates' measures are in the modules of
their stage (evals.asr, evals.tts, evals.emotion, evals.lipsync, evals.llm_decoding); the
export builds a variant and asks them for the verdict."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence


def verdict(failures: Sequence[str], passed: str) -> dict[str, bool | str]:
    """{"passes_gate", "why"}: every bound the variant broke, or, when it broke none,
    `passed` (its figures against their bounds)."""
    return {"passes_gate": not failures, "why": "; ".join(failures) if failures else passed}


def side_by_side(
    time_once: Callable[[str, int], float],
    *,
    rounds: int,
    unit: str = "ms",
    digits: int = 2,
    batches: Sequence[int] = (1, 8),
    warmup: bool = False,
) -> dict[str, dict[str, float]]:
    """FP32 against INT8, timed alternately in one run (the same machine load for both):
    `time_once("fp32" | "int8", batch)` -> one figure (lower is faster); per batch the median
    of `rounds` -> {"batch_N": {"fp32_<unit>", "int8_<unit>", "speedup"}}."""
    speed = {}
    for batch in batches:
        if warmup:
            time_once("fp32", batch), time_once("int8", batch)
        runs: dict[str, list[float]] = {"fp32": [], "int8": []}
        for _ in range(rounds):
            for name, values in runs.items():
                values.append(time_once(name, batch))
        fp32, int8 = (statistics.median(runs[name]) for name in ("fp32", "int8"))
        speed[f"batch_{batch}"] = {
            f"fp32_{unit}": round(fp32, digits),
            f"int8_{unit}": round(int8, digits),
            "speedup": round(fp32 / int8, 2),
        }
    return speed


def faster(speed: dict[str, dict[str, float]]) -> bool:
    """Whether INT8 was faster at every batch of a `side_by_side` result."""
    return all(v["speedup"] > 1.0 for v in speed.values())


def timed_ms(run: Callable[[], object]) -> float:
    """Milliseconds of one call of `run`."""
    import time

    started = time.perf_counter()
    run()
    return 1000 * (time.perf_counter() - started)
