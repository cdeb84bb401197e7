"""Engine verification with Polygraphy: any two runners, the same inputs, per-output tolerances.

`compare_runners` runs a candidate and a reference Polygraphy runner on one feed dict
(`Comparator.run`) and compares every output with `Comparator.compare_accuracy` and
`SimpleCompareFunc` (what `CompareFunc.simple` builds; that spelling is deprecated in
Polygraphy 0.53). For `python -m export engines` the candidate is the engine (`engine_runner`:
`TrtRunner` over `EngineFromBytes`) and the reference the FP32 ONNX export on ONNX Runtime's
CPU provider (`onnx_reference`: `OnnxrtRunner` over `SessionFromOnnx`); the tests compare two
ONNX Runtime runners, so everything but running an engine is exercised without TensorRT.

How the stated tolerances map: each `Tolerance(atol, rtol)` of `build.STAGES` goes unchanged
into `SimpleCompareFunc`'s per-output `atol`/`rtol` with the `elemwise` check, in which an
element fails only if |candidate - reference| > atol AND > rtol * |reference| (the reference is
the second runner, so relative errors are relative to ONNX Runtime). That is
|diff| <= max(atol, rtol * |ref|), where the hand-written check allowed atol + rtol * |ref|:
the same when rtol is 0 (renderer frames, VAD speech_prob), otherwise up to 2x stricter, never
looser, so no engine that the old check rejected passes. A NaN difference fails the element,
so NaN or Inf in an engine output (or an Inf on both sides) fails its output without a
separate finiteness pass.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from export.common import Tolerance, ValidationError

if TYPE_CHECKING:
    from polygraphy.backend.base import BaseRunner

log = logging.getLogger(__name__)


class EngineVerificationError(ValidationError):
    """A built engine disagrees with ONNX Runtime beyond its stated tolerances."""


@dataclasses.dataclass(frozen=True)
class OutputCheck:
    """One output's comparison: Polygraphy's error figures, the tolerance, the verdict."""

    name: str
    max_abs: float | None  # None: not compared (see `problem`)
    max_rel: float | None
    atol: float
    rtol: float
    passed: bool
    problem: str = ""  # why an output could not be compared (missing, shape)

    def describe(self) -> str:
        if self.problem:
            return f"output {self.name!r}: {self.problem}"
        verdict = "within" if self.passed else "exceed"
        return (
            f"output {self.name!r}: max abs error {self.max_abs:.3g}, max rel "
            f"{self.max_rel:.3g} {verdict} atol={self.atol:g} rtol={self.rtol:g}"
        )

    def to_json(self) -> dict[str, Any]:
        # NaN/Inf as strings: engine.json stays strict JSON (jq, other readers).
        return {
            k: str(v) if isinstance(v, float) and not math.isfinite(v) else v
            for k, v in dataclasses.asdict(self).items()
        }


def onnx_reference(onnx_path: Path, name: str = "onnxrt") -> BaseRunner:
    """The reference runner: the ONNX export on ONNX Runtime's CPU provider."""
    from polygraphy.backend.onnxrt import OnnxrtRunner, SessionFromOnnx

    return OnnxrtRunner(SessionFromOnnx(str(onnx_path), providers=["cpu"]), name=name)


def engine_runner(plan: Path, name: str = "tensorrt") -> BaseRunner:
    """The candidate runner: a serialised engine through TensorRT's Python API (needs a GPU)."""
    from export.tensorrt.engine import require_tensorrt_python

    require_tensorrt_python()  # Polygraphy would only fail later, when the runner activates
    from polygraphy.backend.common import BytesFromPath
    from polygraphy.backend.trt import EngineFromBytes, TrtRunner

    return TrtRunner(EngineFromBytes(BytesFromPath(str(plan))), name=name)


def compare_runners(
    candidate: BaseRunner,
    reference: BaseRunner,
    inputs: Mapping[str, np.ndarray],
    tolerances: Mapping[str, Tolerance],
) -> list[OutputCheck]:
    """Run both on `inputs`; one `OutputCheck` per output of `tolerances`, in its order.

    An output missing from either runner, or of another shape, fails without figures.
    """
    from polygraphy.comparator import Comparator, SimpleCompareFunc

    if candidate.name == reference.name:
        raise ValueError(f"two runners named {candidate.name!r}: results are keyed by name")
    results = Comparator.run([candidate, reference], data_loader=[dict(inputs)])
    (got,) = results[candidate.name]  # one iteration each
    (expected,) = results[reference.name]
    compare = SimpleCompareFunc(
        atol={name: tol.atol for name, tol in tolerances.items()},
        rtol={name: tol.rtol for name, tol in tolerances.items()},
        check_error_stat="elemwise",
        # exact names only (Polygraphy's default falls back to fuzzy and positional matches),
        # and only the outputs that have a tolerance
        find_output_func=lambda name, _index, result: (
            [name] if name in tolerances and name in result else None
        ),
    )
    status: Mapping[str, Any] = {}
    if any(name in got and name in expected for name in tolerances):
        (accuracy,) = Comparator.compare_accuracy(results, compare_func=compare)
        (status,) = accuracy[(candidate.name, reference.name)]
    checks = []
    for name, tol in tolerances.items():
        figures: dict[str, Any] = {"max_abs": None, "max_rel": None, "passed": False}
        if name not in got or name not in expected:
            side = candidate.name if name not in got else reference.name
            figures["problem"] = f"missing from the {side} outputs"
        elif name not in status or isinstance(status[name], bool):  # a shape mismatch
            figures["problem"] = (
                f"shape {tuple(got[name].shape)}, reference {tuple(expected[name].shape)}"
            )
        else:
            result = status[name]
            figures = {
                "max_abs": result.max_absdiff,
                # Polygraphy divides 0 by 0 where identical outputs hold zeros (uint8 frames)
                "max_rel": 0.0 if result.max_absdiff == 0 else result.max_reldiff,
                "passed": bool(result),
            }
        checks.append(OutputCheck(name, atol=tol.atol, rtol=tol.rtol, **figures))
    return checks


def require_passed(checks: list[OutputCheck], name: str) -> None:
    """EngineVerificationError naming every failed output, if any failed."""
    failures = [check.describe() for check in checks if not check.passed]
    if failures:
        raise EngineVerificationError("\n  - ".join([f"{name}: engine rejected", *failures]))
