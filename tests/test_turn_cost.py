"""`python -m perf turn-cost` without a server: Triton's metrics and the processes' CPU
turned into CPU-seconds per turn by stage and queue time per model; the ASR passes split
by kind (avatar.pipeline.priority)."""

from __future__ import annotations

import os

import pytest

from avatar.pipeline.priority import AsrPass, pass_of, shares
from perf.turn_cost import Snapshot, cost_rows, markdown, process_cpu
from serving.gauges import parse, summed_by


def test_a_batch_is_split_by_audio_and_unknown_passes_are_final():
    assert shares(3.0, [1.0, 2.0]) == pytest.approx([1.0, 2.0])
    assert shares(2.0, [0.0, 0.0]) == [1.0, 1.0] and shares(1.0, []) == []
    assert pass_of({"pass": "caption"}) is AsrPass.CAPTION
    assert pass_of({}) is AsrPass.FINAL and pass_of({"pass": "x"}) is AsrPass.FINAL


def _metrics(asr_success: float, caption_s: float, pause_s: float, suffix: str = "") -> dict:
    """Triton's /metrics text as a server would write it, parsed as a snapshot reads it."""
    asr = f'model="asr{suffix}",version="1"'
    return parse(
        f"""# HELP nv_inference_request_success Number of successful inference requests
nv_inference_request_success{{{asr}}} {asr_success}
nv_inference_queue_duration_us{{{asr}}} {asr_success * 2000.0}
nv_inference_compute_infer_duration_us{{{asr}}} {asr_success * 300_000.0}
nv_inference_exec_count{{{asr}}} {asr_success / 2}
avatar_asr_pass_seconds_total{{model="asr{suffix}",pass="caption"}} {caption_s}
avatar_asr_pass_seconds_total{{model="asr{suffix}",pass="pause"}} {pause_s}
avatar_asr_passes_total{{model="asr{suffix}",pass="caption"}} {caption_s}
"""
    )


def test_cost_per_turn_by_stage_and_queue_per_model():
    suffix = "_before"  # a setting's copies count as their models
    first = Snapshot(
        _metrics(0, 0, 0, suffix),
        {"asr_before": 1.0, "asr_encoder": 0.0, "tts_vits": 5.0, "tritonserver": 1.0},
        at=0.0,
    )
    last = Snapshot(
        _metrics(8, 3.0, 1.0, suffix),
        {"asr_before": 2.0, "asr_encoder": 7.0, "tts_vits": 9.0, "tritonserver": 3.0},
        at=10.0,
    )
    costs, queues = cost_rows(first, last, 4, sessions=4, setting="before", suffix=suffix)
    by = {c["stage"]: c for c in costs}
    # the ASR models' 8 CPU-s over 4 turns, 3:1 captions to pauses
    assert by["asr: caption passes"]["cpu_s_per_turn"] == pytest.approx(1.5)
    assert by["asr: pause passes"]["cpu_s_per_turn"] == pytest.approx(0.5)
    assert by["asr: caption passes"]["requests_per_turn"] == pytest.approx(0.75)
    assert by["tts"]["cpu_s_per_turn"] == pytest.approx(1.0)
    assert by["all"]["cpu_s_per_turn"] == pytest.approx(3.5)
    assert by["all"]["cores_busy"] == pytest.approx(1.4)
    (asr,) = [q for q in queues if q["model"] == "asr"]
    assert (asr["queue_ms"], asr["compute_ms"], asr["batch"]) == (2.0, 300.0, 2.0)
    table = markdown(
        [
            {
                "sessions": 4,
                "setting": "before",
                "turns": 4,
                "failed": 0,
                "first_audio_p50_ms": 1,
                "first_audio_p95_ms": 2,
                "stall_ms_total": 0,
            }
        ],
        costs,
        queues,
    )
    assert "| asr: caption passes | 1.50 (0.6) |" in table and "| asr | 2.0 (2.0) |" in table


def test_metric_series_are_summed_by_label():
    values = parse(
        'nv_inference_request_success{model="asr",version="1"} 3\n'
        'nv_inference_request_success{model="asr",version="2"} 1\n'
        'nv_inference_request_failure{model="asr",reason="REJECTED"} 9\n'
        "nv_gpu_utilization 0.5\n"
    )
    assert summed_by(values, "nv_inference_request_success") == {"asr": 4.0}
    assert summed_by(values, "nv_inference_request_failure", "reason") == {"REJECTED": 9.0}
    assert summed_by(values, "nv_gpu_utilization") == {}


def test_the_gateways_cpu_is_read_from_proc():
    cpu = process_cpu(None, os.getpid())
    assert cpu["gateway"] > 0
