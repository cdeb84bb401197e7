"""Smoke test of the perf_analyzer sweep (the benchmark itself is `make perf`)."""

from __future__ import annotations

import csv
from pathlib import Path

from avatar.server import EmbeddedServer
from perf.__main__ import main


def test_sweep_writes_csv(triton_server: EmbeddedServer, tmp_path: Path, capsys) -> None:
    code = main(
        [
            "sweep",
            "--url",
            triton_server.grpc_url,
            "--models",
            "vad",
            "--concurrency",
            "1",
            "2",
            "--measurement-ms",
            "1000",
            "--stability",
            "100",
            "--out",
            str(tmp_path),
        ]
    )
    assert code == 0
    rows = list(csv.DictReader((tmp_path / "vad.csv").open()))
    assert [int(r["concurrency"]) for r in rows] == [1, 2]
    assert all(float(r["throughput_per_s"]) > 0 and float(r["p99_ms"]) > 0 for r in rows)
    assert "infer/s" in capsys.readouterr().out
