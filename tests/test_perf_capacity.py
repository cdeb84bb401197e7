"""`python -m perf capacity`'s bookkeeping, without a server: what a reply's messages make
of a turn, a level's summary and the sessions-per-machine figure."""

from __future__ import annotations

import numpy as np
import pytest

from avatar.live_protocol import Audio
from clients.live import CHUNK_S, LiveReply
from perf.capacity import (
    NEVER_IN,
    LevelRow,
    SessionRow,
    _record,
    answered,
    figure_line,
    markdown,
    played_until,
    questions_per_session,
    sessions_per_machine,
    summarise_level,
)
from perf.harness import playback
from perf.latency import LEAD_S, TurnRow, measure_turn, speech_signal


def _turn(first_audio: float | None, error: str = "", late: int = 0) -> TurnRow:
    return TurnRow(4, "today", "human", 2.0, "", first_audio=first_audio, late=late, error=error)


def test_playback_counts_late_pieces_once_per_stall() -> None:
    # the second piece comes 0.5 s late: the player waits, so the third is in time
    heard = playback(zip([10.0, 12.5, 14.2], [0.0, 2.0, 4.0], strict=True))
    assert heard.late == 1 and heard.stall_s == pytest.approx(0.5)
    assert playback(zip([10.0, 10.1, 13.9], [0.0, 2.0, 4.0], strict=True)).late == 0
    assert playback([]).late == 0


def _reply(speech: np.ndarray, *, cancelled: str = "") -> tuple[LiveReply, np.ndarray]:
    """A reply as the session records it: speech sent from t=100, the turn, two AUDIO
    pieces, the second late for a player started at the first."""
    signal = speech_signal(speech)
    reply = LiveReply()
    reply.at["speech_first_sent"] = 100.0
    speech_end = 100.0 + (len(signal) / 16_000) // CHUNK_S * CHUNK_S  # about the last frame
    pcm = np.zeros(16, np.float32)
    events = [
        (speech_end + 0.1, {"type": "speech_start"}),
        (speech_end + 0.3, {"type": "speech_end", "utterance_s": 1.0}),
        (speech_end + 0.31, {"type": "turn_start", "turn": 1}),
        (speech_end + 0.5, {"type": "transcript", "turn": 1, "text": "where is the spa"}),
        (speech_end + 0.9, Audio(0, 1, 0.0, 22050, pcm)),
        (speech_end + 2.4, Audio(1, 1, 1.0, 22050, pcm)),  # due at +1.9: 0.5 s late
    ]
    if cancelled:
        events.append((speech_end + 2.5, {"type": "interrupt", "turn": 1, "reason": cancelled}))
    events.append((speech_end + 2.6, {"type": "turn_end", "turn": 1, "cancelled": cancelled}))
    for at, item in events:
        _record(reply, "binary" if isinstance(item, Audio) else "text", item, at)
    return reply, signal


def test_a_turn_is_measured_from_the_end_of_speech() -> None:
    speech = np.zeros(16_000, np.float32)
    speech[: 16_000 - 1600] = 0.3  # speech to 0.9 s, then 0.1 s of silence
    reply, signal = _reply(speech)
    assert answered(reply)
    row = _turn(None)
    measure_turn(row, reply, signal)
    assert not row.error
    # the end of speech: the frame holding LEAD_S + 0.9 s was sent that many frames in
    end = 100.0 + int((LEAD_S + 0.9) * 16_000) // 512 * CHUNK_S
    assert row.first_audio == pytest.approx((reply.at["first_audio_turn1"] - end) * 1000, abs=0.1)
    assert row.transcript == "where is the spa"
    assert row.late == 1 and row.stall == pytest.approx(500.0, abs=0.1)


def test_the_speaker_listens_to_the_whole_reply_before_the_next_question() -> None:
    reply, _signal = _reply(np.full(8000, 0.3, np.float32))
    # 16 samples at 22050 Hz from start_s 1.0, 0.5 s of waiting for the late second piece
    first = reply.at["first_audio_turn1"]
    assert played_until(reply) == pytest.approx(first + 0.5 + 1.0 + 16 / 22050)
    assert played_until(LiveReply()) == 0.0


def test_a_barged_in_turn_is_not_a_failure_but_another_cut_is() -> None:
    speech = np.full(8000, 0.3, np.float32)
    reply, signal = _reply(speech, cancelled="barge-in")
    row = _turn(None)
    measure_turn(row, reply, signal, barged=True)
    assert not row.error and row.first_audio is not None
    row = _turn(None)
    measure_turn(row, reply, signal)  # not ours: the speaker's own pause split the question
    assert row.error.startswith("turn ended")


def test_a_question_is_answered_only_when_its_last_turn_ended() -> None:
    reply = LiveReply()
    for at, message in enumerate(
        [
            {"type": "speech_start"},
            {"type": "speech_end"},
            {"type": "turn_start", "turn": 1},
            {"type": "speech_start"},  # the question goes on: the first turn is cut
            {"type": "turn_end", "turn": 1, "cancelled": "barge-in"},
        ]
    ):
        _record(reply, "text", message, float(at))
    assert not answered(reply)
    _record(reply, "text", {"type": "speech_end"}, 6.0)
    _record(reply, "text", {"type": "turn_start", "turn": 2}, 7.0)
    assert not answered(reply)
    _record(reply, "text", {"type": "turn_end", "turn": 2, "cancelled": ""}, 8.0)
    assert answered(reply)


def test_a_level_summarised() -> None:
    turns = [_turn(float(ms), late=1) for ms in range(1000, 2000, 100)]  # 10 answered
    turns += [
        _turn(None, error="turn_failed: the turn failed on the server"),
        _turn(None, error="turn ended [{'turn': 3, 'cancelled': 'barge-in'}]"),  # split
        _turn(None, error=NEVER_IN),
        _turn(None, error=NEVER_IN),
    ]
    sessions = [
        SessionRow("today", 4, 0, admitted=True, refused={"turn_failed": 1}, pings_ms=[2.0, 4.0]),
        SessionRow("today", 4, 1, admitted=True, told_busy=1, barge_in_ms=120.0),
        SessionRow("today", 4, 2, admitted=True, barge_in_ms=180.0, pings_ms=[3.0]),
        SessionRow("today", 4, 3, admitted=False, told_busy=3, refused={"busy": 3}),
    ]
    metrics = {
        'avatar_gateway_loop_lag_seconds{quantile="0.5"}': 0.002,
        'avatar_gateway_loop_lag_seconds{quantile="0.99"}': 0.041,
        "avatar_gateway_loop_lag_seconds_max": 0.3,
        'avatar_gateway_refusals_total{code="busy"}': 4.0,
        'avatar_gateway_refusals_total{code="turn_failed"}': 1.0,
    }
    row = summarise_level("today", 4, turns, sessions, metrics, wall_s=61.23)
    assert (row.admitted, row.never_in, row.told_busy) == (3, 1, 4)
    assert (row.questions, row.answered, row.failed, row.split) == (12, 10, 1, 1)
    assert row.first_audio_p50_ms == pytest.approx(1450.0)
    assert row.first_audio_p95_ms == pytest.approx(1855.0)
    assert row.refused == "turn_failed 1"  # busy apart
    assert row.gateway_refusals == "busy 4, turn_failed 1"
    assert (row.loop_lag_p50_ms, row.loop_lag_p99_ms, row.loop_lag_max_ms) == (2.0, 41.0, 300.0)
    assert row.ping_p50_ms == 3.0
    assert row.late_chunks == 10
    assert (row.barge_in_p50_ms, row.barge_in_max_ms, row.barge_in_missed) == (150.0, 180.0, 1)
    assert row.wall_s == 61.2
    # a gateway without the loop-lag metrics (before them): no figure, not zero
    old = summarise_level("before", 4, turns, sessions, {})
    assert old.loop_lag_p50_ms is None and old.gateway_refusals == "0"
    table = markdown([row, old], ["today", "before"])
    assert "| 4 | today | 1450 / 1855 | 1 of 12 | turn_failed 1 | 4 (1) | 2 / 41 |" in table
    assert "| 4 | before | 1450 / 1855 | 1 of 12 | turn_failed 1 | 4 (1) | - |" in table


def _level(
    stack: str,
    level: int,
    p95_ms: float | None,
    *,
    failed: int = 0,
    never_in: int = 0,
    busy: int = 0,
):
    return LevelRow(
        stack, level, level - never_in, never_in, busy, 8, 8 - failed, failed, 0,
        p95_ms and p95_ms / 2, p95_ms, "0", None, None, None, None, None, 0, 0.0,
        None, None, 0, 60.0,
    )  # fmt: skip


def test_sessions_per_machine_is_the_last_level_of_an_unbroken_run() -> None:
    rows = [
        _level("today", 1, 900.0),
        _level("today", 2, 1400.0),
        _level("today", 4, 1990.0),
        _level("today", 6, 2600.0),
        _level("today", 8, 1500.0, never_in=4),  # capped by admission: not 8 per machine
        _level("before", 1, 1500.0),
        _level("before", 2, 2100.0),
        _level("before", 4, 1900.0),  # after a level that failed: noise, not capacity
    ]
    assert sessions_per_machine(rows, "today") == 4
    assert sessions_per_machine(rows, "before") == 1
    assert sessions_per_machine(rows, "today", target_p95_s=3.0) == 6
    assert sessions_per_machine([_level("today", 1, 2500.0)], "today") == 0
    assert sessions_per_machine([_level("today", 1, 900.0, failed=1)], "today") == 0
    assert sessions_per_machine([_level("today", 1, None)], "today") == 0
    # told busy, then in: served one after another, not at once
    assert sessions_per_machine([_level("today", 1, 900.0, busy=1)], "today") == 0
    assert figure_line(rows, ["today", "before"], 2.0).endswith("today 4, before 1")


def test_low_levels_get_more_questions_per_session() -> None:
    assert [questions_per_session(n, 3, 8) for n in (1, 2, 4, 6, 8)] == [8, 4, 3, 3, 3]
