"""INT8 verdicts: measured by a variant's gate, recorded in `gates.json`, re-checked cheaply.

A variant's gate (word error rate on human speech, visemes on held-out sentences, what users
hear, perplexity) takes minutes per model, and five of them on a fresh machine held its first
demo for 20 minutes. A verdict depends on three things only: the variant's file, the
gate's code, and the numerics of the CPU that runs it. So:

- `gates.json` (committed beside this module) records, per model, the variant's sha256, the
  gate's code (`gate_code`: a digest of every project module the gate imports), its outputs
  on one fixed probe input, and the gate's record as measured;
- a build whose variant and gate code are the recorded ones runs the probe (well under a
  second) and, when this CPU's outputs agree with the recorded ones (`probe_differs`), takes
  the recorded verdict: `"verdict": "recorded"` in the sidecar;
- otherwise (a changed variant or gate, a CPU whose numerics differ, or AVATAR_GATES=run) it
  runs the gate: `"verdict": "measured"`;
- `python -m export gates` runs every gate that has not run on this machine (its record is
  kept beside the artifact, GATE_FILE) and fails when a verdict differs from the sidecar's;
  `--record` writes what it measured into `gates.json`. `make test` runs it: CI runs every
  gate, and a stale record fails CI.
"""

from __future__ import annotations

import json
import logging
import os
import platform
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from export.sidecar import Sidecar, sha256_file

log = logging.getLogger(__name__)

RECORDS = Path(__file__).with_name("gates.json")
CALIBRATION_FILE = "calibration.json"  # beside an artifact: what its INT8 variant was calibrated on
GATE_FILE = "gate.json"  # beside an artifact: its variant's gate as measured on this machine
GATES_ENV = "AVATAR_GATES"  # "run": measure every gate in the build, never take a record
PROBE_VALUES = 256  # output values kept per probe output (evenly spaced)
# A probe agrees when at most PROBE_OUTLIERS of its values differ by more than
# PROBE_ATOL x the output's spread: the same integers on two CPUs leave only float
# rounding (and, rarely, a value that rounds to the next quantisation step); a kernel that
# saturates moves many values by much more.
PROBE_ATOL = 0.01
PROBE_OUTLIERS = 0.02
PROVENANCE = ("verdict", "measured_on", "sha256", "gate_code", "probe")  # added to a gate's record


def gate_code(model: str) -> str:
    """A digest of the gate of `model`: its module and every project module it imports,
    transitively (a changed metric or data set changes the verdict's key)."""
    import ast
    import hashlib

    from export.registry import GATES

    root = Path(__file__).resolve().parents[1]
    todo, seen = [GATES[model].split(":")[0]], {}
    while todo:
        name = todo.pop()
        path = _module_file(root, name)
        if path is None or path in seen.values():
            continue
        seen[name] = path
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                todo += [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                todo += [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
    digest = hashlib.sha256()
    for path in sorted(seen.values()):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def _module_file(root: Path, name: str) -> Path | None:
    """The source file of the project module `name`, or None (not ours, or not a module)."""
    base = root.joinpath(*name.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def cpu_name() -> str:
    """The CPU's model name (for the record of where a figure was measured)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def load_records(path: Path = RECORDS) -> dict[str, dict[str, Any]]:
    return json.loads(path.read_text()) if path.is_file() else {}


def probe_outputs(
    session, feed: Mapping[str, np.ndarray], outputs: Sequence[str] | None = None
) -> dict[str, dict[str, Any]]:
    """What the probe keeps of `session`'s `outputs` (default all) on `feed`: per output its
    shape, spread and PROBE_VALUES values at evenly spaced positions."""
    names = list(outputs or [o.name for o in session.get_outputs()])
    probe = {}
    for name, value in zip(names, session.run(names, dict(feed)), strict=True):
        flat = np.asarray(value, dtype=np.float64).reshape(-1)
        picks = np.linspace(0, flat.size - 1, min(PROBE_VALUES, flat.size)).round().astype(int)
        probe[name] = {
            "shape": list(np.shape(value)),
            "std": float(flat.std()) if flat.size else 0.0,
            "values": [float(f"{v:.7g}") for v in flat[picks]],
        }
    return probe


def probe_differs(got: Mapping[str, Any], recorded: Mapping[str, Any]) -> str | None:
    """Why `got` (probe_outputs here) disagrees with `recorded`, or None when it agrees."""
    if set(got) != set(recorded):
        return f"outputs {sorted(got)} vs recorded {sorted(recorded)}"
    for name, want in recorded.items():
        have = got[name]
        if have["shape"] != want["shape"]:
            return f"{name}: shape {have['shape']} vs recorded {want['shape']}"
        a, b = np.asarray(have["values"]), np.asarray(want["values"])
        atol = PROBE_ATOL * max(want["std"], 1e-12)
        far = np.abs(a - b) > atol
        if far.mean() > PROBE_OUTLIERS:
            return (
                f"{name}: {int(far.sum())} of {far.size} probe values differ by more than "
                f"{atol:.3g} (max {np.abs(a - b).max():.3g})"
            )
    return None


def judged(
    model: str,
    variant: Path,
    probe_feed: Mapping[str, np.ndarray],
    gate: Callable[[], dict],
    *,
    outputs: Sequence[str] | None = None,
    records: Mapping[str, dict[str, Any]] | None = None,
    code: str | None = None,
) -> dict:
    """The sidecar record of `model`'s `variant`: the recorded verdict where this file, this
    gate (`code`, default `gate_code(model)`) and this CPU's numerics are those it was
    measured with, else `gate()` measured now."""
    from export.common import onnx_session

    records = load_records() if records is None else records
    code = gate_code(model) if code is None else code
    sha = sha256_file(variant)
    probe = probe_outputs(onnx_session(variant, threads=1), probe_feed, outputs)
    recorded = records.get(model)
    why = None
    if os.environ.get(GATES_ENV) == "run":
        why = f"{GATES_ENV}=run"
    elif recorded is None:
        why = "no recorded verdict"
    elif recorded["sha256"] != sha:
        why = f"the variant (sha256 {sha[:12]}) is not the recorded {recorded['sha256'][:12]}"
    elif recorded["gate_code"] != code:
        why = f"the gate's code changed since its verdict was recorded ({code})"
    else:
        why = probe_differs(probe, recorded["probe"])
        if why is not None:
            why = f"this CPU's numerics differ from the recording's: {why}"
    if why is None:
        log.info("%s: INT8 verdict recorded on %s (probe agrees)", model, recorded["cpu"])
        return {
            **recorded["record"],
            "verdict": "recorded",
            "measured_on": recorded["cpu"],
            "sha256": sha,
            "gate_code": code,
            "probe": probe,
        }
    log.info("%s: running the INT8 gate (%s)", model, why)
    return _measured(gate(), sha, code, probe)


def variant_gate(gate: Callable[[Path, Path], dict]) -> Callable[[Path], dict]:
    """The gate of the INT8 variant in an artifact folder, from `gate(FP32 file, variant)`
    (`model.onnx` and VARIANT_FILE beside it): what a stage declares as its gate."""
    from export.quantize import VARIANT_FILE

    def gate_folder(folder: Path) -> dict:
        return gate(Path(folder) / "model.onnx", Path(folder) / VARIANT_FILE)

    return gate_folder


def judged_variant(
    model: str,
    folder: Path,
    probe_feed: Mapping[str, np.ndarray],
    gate: Callable[[Path, Path], dict],
    calibration: Mapping[str, Any] | None = None,
) -> dict:
    """The sidecar record of the INT8 variant just built in the artifact `folder` (`judged`:
    recorded, or `gate(model.onnx, variant)` measured now), its verdict logged; with its
    `calibration` record written beside it (CALIBRATION_FILE)."""
    from export.quantize import VARIANT_FILE, logged

    if calibration is not None:
        (Path(folder) / CALIBRATION_FILE).write_text(json.dumps(calibration, indent=1))
    record = judged(
        model, Path(folder) / VARIANT_FILE, probe_feed, lambda: variant_gate(gate)(folder)
    )
    return logged(model, record)


def _measured(record: dict, sha: str, code: str, probe: dict) -> dict:
    where = {"verdict": "measured", "measured_on": cpu_name(), "sha256": sha, "gate_code": code}
    return {**record, **where, "probe": probe}


def measured(folder: Path, variant_file: str, gate: Callable[[], dict]) -> dict:
    """The gate of the variant in the artifact `folder` as measured on this machine by the
    gate's code as it is now: the sidecar's record when the build measured it, else
    GATE_FILE beside it (the gate run once and kept)."""
    kept = measured_here(folder, variant_file)
    if kept is not None:
        return kept
    sidecar = Sidecar.load(folder)
    record = sidecar.validation["variants"][variant_file]
    log.info("%s: running the INT8 gate of %s", sidecar.model, variant_file)
    fresh = _measured(gate(), record["sha256"], gate_code(sidecar.model), record["probe"])
    (folder / GATE_FILE).write_text(json.dumps(fresh, indent=1, default=_json_default))
    return fresh


def measure_all(folders: Mapping[str, Path], variant_file: str) -> dict[str, dict]:
    """`measured` for every gated model in `folders` ({name: artifact folder}), the gates
    that still have to run spread over the CPU's cores (each gate runs its sessions on one
    thread; their timings alternate FP32 and INT8, so a neighbour loads both alike)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from export.common import worker_logging

    todo = [n for n, f in folders.items() if measured_here(f, variant_file) is None]
    workers = min(len(todo), os.cpu_count() or 1)
    results: dict[str, dict] = {}
    if workers > 1:
        context = multiprocessing.get_context("spawn")  # no forked ONNX Runtime thread pools
        with ProcessPoolExecutor(workers, context, initializer=worker_logging) as pool:
            futures = {n: pool.submit(_measure, n, folders[n], variant_file) for n in todo}
            results = {n: future.result() for n, future in futures.items()}
    return {n: results.get(n) or _measure(n, f, variant_file) for n, f in folders.items()}


def measured_here(folder: Path, variant_file: str) -> dict | None:
    """The record of the variant in `folder` gated on this machine by the gate's code as it
    is now (by the build, or into GATE_FILE), or None."""
    sidecar = Sidecar.load(folder)
    record, code = sidecar.validation["variants"][variant_file], gate_code(sidecar.model)
    if record.get("verdict") == "measured" and record.get("gate_code") == code:
        return record
    kept = folder / GATE_FILE
    if kept.is_file():
        saved = json.loads(kept.read_text())
        if saved.get("sha256") == record["sha256"] and saved.get("gate_code") == code:
            return saved
    return None


def _measure(name: str, folder: Path, variant_file: str) -> dict:
    from export.registry import gate

    return measured(folder, variant_file, lambda: gate(name)(folder))


def as_record(model: str, record: Mapping[str, Any]) -> dict[str, Any]:
    """The `gates.json` entry of a measured sidecar record."""
    body = {k: v for k, v in record.items() if k not in PROVENANCE}
    return {
        "sha256": record["sha256"],
        "gate_code": record["gate_code"],
        "cpu": record["measured_on"],
        "probe": record["probe"],
        "record": body,
    }


def write_records(records: Mapping[str, dict[str, Any]], path: Path = RECORDS) -> None:
    text = json.dumps(dict(sorted(records.items())), indent=1, default=_json_default)
    path.write_text(text + "\n")


def _json_default(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"not JSON serialisable: {type(value)}")
