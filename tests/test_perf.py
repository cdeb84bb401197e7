"""Smoke tests of the perf commands with tiny settings (the benchmarks themselves are
`python -m perf suite|batching|baseline`; their figures are printed, never asserted)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from perf.__main__ import main
from serving.server import EmbeddedServer

# `extended` (make test-extended): the benchmarks' other smoke runs. CI keeps
# test_suite_smoke, which drives perf_analyzer against the real server (an ensemble and a
# decoupled model); what the others serve is tested in CI by the tests named at each.


# perf_analyzer again (test_suite_smoke)
@pytest.mark.extended
def test_sweep_writes_csv(triton_server: EmbeddedServer, tmp_path: Path, capsys) -> None:
    # renderer, not vad: vad's 0.5-s queue timeout refuses a request whenever the shared
    # machine stalls the server that long, and perf_analyzer stops at the first error
    code = main(
        [
            "sweep",
            "--url",
            triton_server.grpc_url,
            "--models",
            "renderer",
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
    rows = list(csv.DictReader((tmp_path / "renderer.csv").open()))
    assert [int(r["concurrency"]) for r in rows] == [1, 2]
    assert all(float(r["throughput_per_s"]) > 0 and float(r["p99_ms"]) > 0 for r in rows)
    assert "infer/s" in capsys.readouterr().out


def _csv(path: Path) -> list[dict[str, str]]:
    assert path.is_file(), f"{path} was not written"
    return list(csv.DictReader(path.open()))


def _png(path: Path) -> None:
    assert path.is_file(), f"{path} was not written"
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"


def test_suite_smoke(triton_server: EmbeddedServer, tmp_path: Path, capsys) -> None:
    """`perf suite` with tiny settings: an ensemble and a decoupled model (--streaming).
    (Not vad: its 0.5-s queue timeout refuses requests when the shared machine stalls.)"""
    args = ["suite", "--url", triton_server.grpc_url, "--models", "avatar_say", "tts"]
    assert main([*args, "--concurrency", "1", "--requests", "2", "--out", str(tmp_path)]) == 0
    blob = json.loads((tmp_path / "suite.json").read_text())
    assert blob["failures"] == [] and blob["machine"]["load_1m_5m_15m"]
    rows = _csv(tmp_path / "suite.csv")
    assert [r["model"] for r in rows] == ["avatar_say", "tts"]
    assert all(float(r["throughput_per_s"]) > 0 and float(r["p95_ms"]) > 0 for r in rows)
    assert (tmp_path / "suite.md").read_text().count("\n| tts | 1 |") == 1
    for name in ("suite.png", "suite-avatar_say.png", "suite-tts.png"):
        _png(tmp_path / name)
    assert "| avatar_say | 1 |" in capsys.readouterr().out


# perf_analyzer again, on a server of its own (test_suite_smoke; rewritten configs:
# test_setting_copies_carry_their_settings)
@pytest.mark.extended
def test_batching_smoke(tmp_path: Path) -> None:
    """`perf batching`: one point, its own server with the rewritten config."""
    args = ["batching", "--models", "renderer", "--batches", "4", "--delays-us", "1000"]
    args += ["--instances", "2", "--concurrency", "2", "--requests", "8", "--out", str(tmp_path)]
    assert main(args) == 0
    (row,) = _csv(tmp_path / "batching.csv")
    assert (row["max_batch_size"], row["delay_us"], row["instances"]) == ("4", "1000", "2")
    assert float(row["throughput_per_s"]) > 0 and float(row["p99_ms"]) >= float(row["p50_ms"])
    assert "| renderer | 4 | 1 | 2 |" in (tmp_path / "batching.md").read_text()
    _png(tmp_path / "batching-renderer.png")


# served turns: tests/test_pipeline_server.py; the in-process path: test_pipeline_local.py
@pytest.mark.extended
def test_baseline_smoke(triton_server: EmbeddedServer, tmp_path: Path) -> None:
    """`perf baseline`: one session, one short turn on each side, ratios written."""
    args = ["baseline", "--url", triton_server.grpc_url, "--sessions", "1", "--turns", "1"]
    assert main([*args, "--max-tokens", "8", "--no-warmup", "--out", str(tmp_path)]) == 0
    levels = _csv(tmp_path / "baseline.csv")
    assert [r["side"] for r in levels] == ["baseline", "triton"]
    assert all(int(r["errors"]) == 0 and float(r["full_reply_median_s"]) > 0 for r in levels)
    turns = _csv(tmp_path / "baseline-turns.csv")
    assert all(r["transcript"] and float(r["audio_s"]) > 0 for r in turns)
    (ratio,) = json.loads((tmp_path / "baseline.json").read_text())["ratios"]
    assert ratio["sessions"] == 1 and ratio["first_audio"] > 0
    assert "Triton / baseline" in (tmp_path / "baseline.md").read_text()
    _png(tmp_path / "baseline-first_audio_median_s.png")


# served vs in-process ASR: tests/test_asr_triton.py (transcripts equal faster-whisper)
@pytest.mark.extended
def test_asr_server_smoke(triton_server: EmbeddedServer, tmp_path: Path) -> None:
    """`perf asr-server`: two utterances at two streams, in-process and through Triton."""
    args = ["asr-server", "--url", triton_server.grpc_url, "--rounds", "1", "--streams", "2"]
    assert main([*args, "--utterances", "2", "--out", str(tmp_path)]) == 0
    (row,) = json.loads((tmp_path / "asr_server.json").read_text())
    assert row["streams"] == 2 and row["in_process"]["per_s"] > 0
    assert 0 < row["triton"]["vs_in_process"] < 10
    assert "in_process" in (tmp_path / "asr_server.md").read_text()


# a spoken question in real time through vad endpointing: tests/test_gateway.py
@pytest.mark.extended
def test_latency_smoke(triton_server: EmbeddedServer, tmp_path: Path, capsys) -> None:
    """`perf latency`: one spoken question in real time through vad endpointing and the
    avatar stream; every milestone measured from the end of speech, in order."""
    args = ["latency", "--url", triton_server.grpc_url, "--sessions", "1", "--questions", "1"]
    assert main([*args, "--settings", "today", "--pause-s", "0", "--out", str(tmp_path)]) == 0
    (turn,) = _csv(tmp_path / "turns.csv")
    assert turn["error"] == "" and turn["transcript"]
    order = ["endpoint", "transcript_ms", "first_sentence", "first_audio"]
    values = [float(turn[k]) for k in order]
    assert values == sorted(values) and 0 < values[0] < 2000, values
    # the whole question on the page: at the pause's caption, at the latest the transcript
    assert 0 < float(turn["caption"]) <= float(turn["transcript_ms"])
    assert "| 1 | first_audio |" in capsys.readouterr().out
    _png(tmp_path / "latency.png")


@pytest.mark.parametrize("setting", ["release", "fp32", "threads2", "clause2"])
def test_setting_copies_carry_their_settings(
    embedded_repository: Path, tmp_path: Path, setting: str
) -> None:
    import shutil

    from model_configs.pbtxt import parse_config
    from perf.latency import COPIES, add_setting_models

    for name in COPIES[setting]:
        shutil.copytree(embedded_repository / name, tmp_path / name, symlinks=True)
    add_setting_models(tmp_path, setting)
    for name, values in COPIES[setting].items():
        copy = tmp_path / f"{name}_{setting}"
        config = parse_config(copy / "config.pbtxt")
        assert config.name == copy.name
        assert {k: config.parameters[k].string_value for k in values} == values
        files = sorted(f for f in (copy / "1").iterdir() if f.name != "__pycache__")
        assert files and all(f.is_symlink() or f.suffix == ".py" for f in files), files
        if "onnx_file" in values:  # the graph the copy serves is there
            assert (copy / "1" / values["onnx_file"]).resolve().is_file()
    if setting == "fp32":  # today serves the INT8 graphs whose gates passed; this replaces them
        from serving.served import served_onnx

        for name in ("llm_decoder", "tts_vits", "emotion_encoder"):
            today = parse_config(tmp_path / name / "config.pbtxt")
            assert today.parameters["onnx_file"].string_value == served_onnx(name).name, name


def test_endpointing_counts_questions_cut_at_a_pause() -> None:
    from avatar.vad import CHUNK_S
    from perf.endpointing import endpoints

    # 20 chunks of speech, a 10-chunk (0.32 s) pause, 20 more, then silence
    probs = np.concatenate([np.full(20, 0.9), np.zeros(10), np.full(20, 0.9), np.zeros(40)])
    early, delay, start = endpoints(probs, end_silence_s=0.2)
    assert early == 1 and delay == pytest.approx(6 * CHUNK_S)  # round(0.2 / 0.032) chunks
    early, delay, start = endpoints(probs, end_silence_s=0.5)
    assert early == 0 and delay == pytest.approx(16 * CHUNK_S) and start == delay


def test_playback_stall_counts_the_waits_for_late_audio() -> None:
    from perf.harness import playback_stall

    # 2-s pieces at 0, 2 and 4 s on the turn clock; the second arrives 0.5 s after it was due,
    # so the third is due 0.5 s later too, and arrives in time
    starts = [0.0, 2.0, 4.0]
    assert playback_stall(zip([10.0, 12.5, 14.2], starts, strict=True)) == pytest.approx(0.5)
    assert playback_stall(zip([10.0, 10.1, 13.9], starts, strict=True)) == 0.0
    assert playback_stall([]) == 0.0


def test_at_concurrency_shares_the_requests_and_records_failures() -> None:
    from perf.harness import Latency, at_concurrency

    def send(n: int) -> int:
        if n == 3:
            raise ValueError("three")
        return n * n

    load = at_concurrency(2, range(6), send)
    assert sorted(s.request for s in load.samples) == list(range(6))
    assert {s.request: s.stream for s in load.samples} == {0: 0, 1: 1, 2: 0, 3: 1, 4: 0, 5: 1}
    (failed,) = load.errors
    assert failed.request == 3 and failed.error == "ValueError: three" and failed.result is None
    assert all(s.result == s.request**2 for s in load.samples if not s.error)
    assert load.latency().count == 5 and load.per_s > 0
    assert Latency.of([1.0, 2.0, 3.0]) == Latency(3, 2.0, pytest.approx(2.9))


# 90 s: 8 questions twice. Served vs in-process turns:
# test_pipeline_local.py::test_the_served_turn_hears_what_the_local_turn_hears
@pytest.mark.extended
def test_first_piece_served_against_in_process(
    triton_server: EmbeddedServer, tmp_path: Path
) -> None:
    """`perf first-piece --served`: each question's reply through `avatar` and in-process,
    same seed, so the same first piece; the served one's milestones in order."""
    args = ["first-piece", "--served", "--url", triton_server.grpc_url, "--rounds", "1"]
    assert main([*args, "--out", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "served.json").read_text())
    served, local = results["rows"]["served"], results["rows"]["in-process"]
    assert len(served) == len(local) == 8
    assert sum(r["same_piece"] for r in served) >= 6, [r["piece"] for r in served]
    assert all(0 < r["llm_ms"] < r["first_audio_ms"] for r in served + local)
    assert "served / in-process" in (tmp_path / "served.md").read_text()
