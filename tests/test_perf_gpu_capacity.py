"""`perf gpu-stages --sessions`: the pacing and the summary, without a GPU or a server."""

from __future__ import annotations

import itertools

from perf.gpu_stages import chain, served
from perf.gpu_stages import sessions as gpu_capacity
from perf.gpu_stages.networks import STAGES


def _turn(total_ms: float, session: int = 0) -> dict:
    share = total_ms / len(chain.CRITICAL_PATH)
    ms = {label: share for label in chain.CRITICAL_PATH}
    ms["lipsync"] = 1000.0  # beside playback: not part of first audio
    return {"session": session, "start_s": 0.0, "end_s": 1.0, "ms": ms}


def test_a_level_row_counts_the_critical_path_only():
    answer = {"turns": [_turn(v) for v in range(100, 2100, 100)], "wall_s": 10.0}
    row = gpu_capacity.summarise_level(4, answer)
    assert row["turns"] == 20
    assert row["turns_per_s"] == 2.0
    assert row["first_audio_ms"]["p50"] == 1050.0
    assert row["first_audio_ms"]["p95"] == 1900.0
    assert set(row["stage_p50_ms"]) == set(chain.CRITICAL_PATH)
    # the transcript at a pause is the ASR encoder and decoder, not the rest of the path
    share = 2 / len(chain.CRITICAL_PATH)
    assert row["transcript_ms"]["p50"] == round(1050.0 * share, 3)
    assert row["turn_detector_ms"]["p95"] == round(1900.0 / len(chain.CRITICAL_PATH), 3)


def test_the_largest_level_within_the_limit_skips_failed_levels():
    def row(sessions, p95, errors=()):
        return {
            "sessions": sessions,
            "turns": 10,
            "turns_per_s": 1.0,
            "errors": list(errors),
            "first_audio_ms": {"p50": p95 / 2, "p95": p95, "n": 10},
        }

    rows = [row(1, 700), row(2, 800), row(4, 1900), row(8, 2600), row(16, 9000)]
    assert gpu_capacity.largest_within(rows) == 4
    assert gpu_capacity.largest_within([row(1, 2500)]) is None
    assert gpu_capacity.largest_within([row(1, 700), row(2, 700, ["boom"])]) == 1
    lines = gpu_capacity.format_table(rows)
    assert lines[2] == "| 1 | 10 | 1.00 | 350 | 700 | nan / nan | nan / nan | 0 |"
    assert lines[-1].endswith(": 4")


def test_stats_delta_gives_each_model_its_mean_queue_and_compute():
    def stats(count, queue_ns, compute_ns):
        inference = {
            "success": {"count": count},
            "queue": {"ns": queue_ns},
            "compute_infer": {"ns": compute_ns},
        }
        return {"model_stats": [{"name": "llm_decoder", "inference_stats": inference}]}

    delta = gpu_capacity.stats_delta(stats(10, 0, 0), stats(14, 8_000_000, 40_000_000))
    assert delta == {"llm_decoder": {"requests": 4, "queue_ms": 2.0, "compute_ms": 10.0}}
    assert gpu_capacity.stats_delta(stats(3, 1, 1), stats(3, 1, 1)) == {}


def test_paced_sessions_stagger_pause_and_end_after_the_level(monkeypatch):
    def chain_once(torch, device, call, models=None):
        return {label: 1.0 for label in chain.CRITICAL_PATH}

    monkeypatch.setattr(chain, "chain_once", chain_once)
    answer = gpu_capacity.paced_sessions(
        None, None, None, sessions=4, level_s=0.5, pause_s=0.2, seed=1
    )
    assert answer["errors"] == []
    by_session: dict[int, list[dict]] = {}
    for turn in answer["turns"]:
        by_session.setdefault(turn["session"], []).append(turn)
    assert sorted(by_session) == [0, 1, 2, 3]
    # what the schedule decides, not when the threads woke: this module runs at idle
    # priority beside the timed tests (tests/conftest.py), where a sleep may end late
    for index, turns in by_session.items():
        turns.sort(key=lambda t: t["start_s"])
        assert turns[0]["start_s"] >= 0.2 * index / 4 - 0.005  # spread over one pause
        for before, after in itertools.pairwise(turns):
            assert after["start_s"] - before["end_s"] >= 0.75 * 0.2 - 0.005  # paused
            assert before["end_s"] + 0.75 * 0.2 < 0.5  # begun only if due before the level
        assert turns[-1]["end_s"] + 1.25 * 0.2 >= 0.5  # a session ends after the level
    assert answer["wall_s"] >= max(t["end_s"] for t in answer["turns"])


def test_a_failing_session_is_reported_not_raised(monkeypatch):
    def chain_once(torch, device, call, models=None):
        raise RuntimeError("stage down")

    monkeypatch.setattr(chain, "chain_once", chain_once)
    answer = gpu_capacity.paced_sessions(None, None, None, sessions=2, level_s=0.1, pause_s=0.01)
    assert answer["turns"] == []
    assert len(answer["errors"]) == 2 and "stage down" in answer["errors"][0]
    row = gpu_capacity.summarise_level(2, answer)
    assert row["errors"] and "first_audio_ms" not in row
    assert gpu_capacity.format_table([row])[2].startswith("| 2 | 0 |")


def test_instances_multiply_the_stage_models_not_the_chain(tmp_path):
    repo = served.write_repository(tmp_path / "repo", gpu=True, instances=2)
    for name in STAGES:
        assert "count: 2 kind: KIND_GPU" in (repo / name / "config.pbtxt").read_text()
    assert "count: 1 kind: KIND_CPU" in (repo / "turn_chain" / "config.pbtxt").read_text()
