"""On air, end to end: `python -m broadcast` against the real tritonserver pushes the anchor
to a real nginx-rtmp server while two chat questions come in, one posted to its HTTP input,
one said in the IRC channel it reads (a real ngIRCd); the stream
is played back from the server while it is live (broadcast.readback) and checked: a steady
25 fps with no gap and no frozen frame, audio on the video's clock with real silence between
answers, each question named and answered in the received audio, its caption on the frames.
The 10-minute broadcast is the `slow` version. Without a server: the programme, the speech on
the stream's clock, the idle life and its blend, the caption."""

from __future__ import annotations

import dataclasses
import logging
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from rtmp_server import free_port, running_rtmp_server
from test_irc_chat import CHANNEL, NGIRCD, Ngircd

from avatar.animation.tables import ARKIT_INDEX
from broadcast.captions import draw_caption
from broadcast.life import Blend, Life
from broadcast.programme import Programme, Segment, stream_speech
from broadcast.show import between_frames
from perf.broadcast import caption_probe, rehearse, schedule, summary

ROOT = Path(__file__).resolve().parents[1]
FPS, SPF = 25, 1920
CAPTION_ON = 0.01
JAW = ARKIT_INDEX["jawOpen"]  # caption_probe: share of bright pixels in the band's left quarter


def _rehearsal(triton_server, folder: Path, questions, seconds: float, irc_url: str = ""):
    with running_rtmp_server() as rtmp:
        return rehearse(
            triton_server.grpc_url,
            rtmp.url("anchor"),
            questions,
            seconds,
            player_ready=lambda: "play: name=" in rtmp.error_log(),
            triton_pid=triton_server.pid,
            max_tokens=24,
            work_dir=folder,
            irc_url=irc_url,
        )


@pytest.fixture(scope="module")
def on_air(triton_server, tmp_path_factory) -> dict:
    """A 36-s broadcast: a question posted to the HTTP input 4 s after it went on air, and
    one said in its IRC channel (a real ngIRCd) 12 s later."""
    folder = tmp_path_factory.mktemp("onair")
    first, second = schedule(2, 4.0, 12.0)
    if not Path(NGIRCD).exists():  # scripts/setup.sh --tests installs it
        logging.getLogger(__name__).warning("no ngircd: both questions over HTTP")
        return _rehearsal(triton_server, folder, [first, second], 36.0)
    irc = Ngircd(folder, free_port())
    irc.start()
    try:
        second = dataclasses.replace(second, via="irc")
        url = f"irc://127.0.0.1:{irc.port}/{CHANNEL}"
        return _rehearsal(triton_server, folder, [first, second], 36.0, irc_url=url)
    finally:
        irc.stop()


def _check_broadcast(rehearsal: dict, questions: int) -> None:
    """What every broadcast must hold, whatever its length."""
    readback = rehearsal["readback"]
    report = readback.report()
    status = rehearsal["status"]
    figures = summary(rehearsal)
    print(figures)  # the figures of this run, in the test's output (-s)
    # a steady frame rate: every tick written on time and received, no gap, never a repeat;
    # at most 1 tick in 100 came late enough to be repeated (with silence): 0 of ~900 on the
    # 2 cores the figures were measured on; on a 2-core CPU half as fast, where the renderer
    # is thinned throughout, 0-2 (25-37 when thinning began at half the queue; docs/broadcast.md)
    output = status["output"]
    assert output["underflows"] <= output["ticks"] // 100, output
    assert abs(report.fps - FPS) < 0.01 and report.max_frame_gap_intervals <= 2.0, report
    assert report.longest_frozen_run == 1, report
    assert report.frames >= FPS * (rehearsal["seconds"] - 2)
    # one clock: the audio's samples keep to their timestamps; silence is samples, not holes
    assert report.av_offset_max_ms <= 40.0 and report.audio_gap_max_ms < 1.0, report
    assert status["on_air"], status
    # the local preview: an HLS playlist of the same stream, its segments served
    preview = rehearsal["preview"]
    assert preview["playlist"].startswith("#EXTM3U") and preview["segments"] >= 2, preview
    assert preview["last_segment_bytes"] > 10_000, preview
    # every question named and answered, heard in the received stream where it was sent
    records = status["records"]
    assert len(records) == questions, records
    for record, question in zip(records, rehearsal["questions"], strict=True):
        assert record["error"] == "" and record["sentences"] >= 1 and record["reply"], record
        assert record["attribution_tick"] < record["answer_tick"] < record["end_tick"]
        for kind in ("attribution", "answer"):
            heard = question[kind]
            assert heard is not None and heard["heard_media_s"] is not None, question
            # heard where it was sent: within its first second (a sentence may open softly,
            # under the onset's threshold, for a few hundred ms)
            assert 0 <= heard["heard_media_s"] - heard["tick"] / FPS <= 1.0, question
            assert heard["posted_to_heard_s"] > 0, question
        assert question["source"] in ("http", "irc")
        # the anchor names the question within seconds of its posting (the answer may wait
        # for the one before it to end)
        assert question["attribution"]["posted_to_heard_s"] < 6.0, question
    # real silence before the first question, speech after each
    start, envelope = readback.audio_timeline()
    first = rehearsal["questions"][0]["attribution"]["tick"] / FPS
    quiet = envelope[int((1.0 - start) * 1000) : int((first - start - 0.1) * 1000)]
    assert quiet.size and quiet.max() < 1e-3, quiet.max()
    # the caption goes up with each question and is not there before the first
    onsets = readback.video_onsets(above=CAPTION_ON)
    for question in rehearsal["questions"]:
        tick = question["attribution"]["tick"]
        assert any(abs(onset * FPS - tick) <= 1 for onset in onsets) or _captioned_at(
            readback, tick
        ), (tick, onsets)
    before = [f.probe for f in readback.frames if f.pts_s < first - 0.1]
    assert before and max(before) < CAPTION_ON, max(before)


def _captioned_at(readback, tick: int) -> bool:
    """The caption was up at `tick` (a caption held from the previous question)."""
    return any(abs(f.pts_s * FPS - tick) < 0.5 and f.probe > CAPTION_ON for f in readback.frames)


@pytest.mark.server
def test_two_chat_questions_on_air_through_nginx_rtmp(on_air):
    _check_broadcast(on_air, questions=2)
    if Path(NGIRCD).exists():  # the second came through the IRC adapter
        assert [q["source"] for q in on_air["questions"]] == ["http", "irc"]
    # the broadcast's own cost, beside tritonserver's (reported, bounded loosely)
    assert on_air["cpu_per_s"]["broadcast_process"] < 1.0, on_air["cpu_per_s"]


@pytest.mark.server
def test_an_unreachable_rtmp_server_is_said_clearly(triton_server):
    from serving.server import free_port

    url = f"rtmp://127.0.0.1:{free_port()}/live/anchor"
    command = [sys.executable, "-m", "broadcast", "--triton-url", triton_server.grpc_url]
    done = subprocess.run(
        [*command, "--url", url, "--preview-port", "0"],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1, done.stderr
    assert "is the RTMP/SRT server running" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("http://example.com/live", "expected rtmp://"),
        ("rtmp://127.0.0.1", "names no application"),
        ("out.mp4", "ending in .flv or .ts"),
    ],
)
def test_a_bad_url_is_refused_before_anything_starts(url, said):
    done = subprocess.run(
        [sys.executable, "-m", "serving.cli", "broadcast", "--url", url],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and said in done.stderr, done.stderr


@pytest.mark.slow
@pytest.mark.server
@pytest.mark.timeout(1200)
def test_ten_minutes_on_air(triton_server, tmp_path):
    """A 10-minute broadcast with a question every 50 s: A/V offset within 40 ms at the end,
    no gap and no frozen frame throughout."""
    rehearsal = _rehearsal(triton_server, tmp_path, schedule(11, 10.0, 50.0), 600.0)
    _check_broadcast(rehearsal, questions=11)
    assert abs(rehearsal["readback"].report().av_offset_ms) <= 40.0


# Without a server -----------------------------------------------------------------------


def test_speech_lands_on_whole_frames_of_the_stream_clock():
    sr, seconds = 22050, 1.23
    audio = np.sin(np.linspace(0, 200, int(sr * seconds))).astype(np.float32) * 0.5
    shapes = np.linspace(0, 1, 37)[:, None].repeat(52, axis=1).astype(np.float32)  # 30 fps
    out_audio, out_shapes = stream_speech(
        audio, sr, shapes, 30.0, stream_fps=FPS, stream_rate=48000
    )
    frames = int(np.ceil(seconds * FPS))
    assert out_shapes.shape == (frames, 52) and out_audio.shape == (frames * SPF,)
    assert abs(np.abs(out_audio).max() - 0.5) < 0.02  # resampled, not rescaled
    assert np.all(np.diff(out_shapes[:, 0]) >= 0)  # the rising weight still rises


def test_the_programme_hands_out_ticks_in_order_and_marks_the_ends():
    programme = Programme(SPF)
    a = Segment(1, "attribution", np.ones(3 * SPF, np.float32), np.ones((3, 52), np.float32))
    b = Segment(1, "answer", np.full(4 * SPF, 2, np.float32), np.full((4, 52), 2, np.float32))
    end = Segment(1, "end", np.zeros(0, np.float32), np.zeros((0, 52), np.float32))
    for segment in (a, b, end):
        programme.add(segment)
    first, second = programme.take(5), programme.take(5)
    assert first.speaking.tolist() == [True] * 5
    assert first.audio[:, 0].tolist() == [1, 1, 1, 2, 2]
    assert [(i, s.kind) for i, s in first.started] == [(0, "attribution"), (3, "answer")]
    assert second.speaking.tolist() == [True, True, False, False, False]
    assert [(i, s.kind) for i, s in second.ended] == [(2, "answer"), (2, "end")]
    assert not second.audio[2:].any()  # silence after the answer
    with pytest.raises(ValueError, match="expected 2 frames"):
        programme.add(Segment(2, "answer", np.zeros(SPF), np.zeros((2, 52))))


def test_idle_life_is_one_curve_and_never_repeats_a_pose():
    life = Life(FPS, seed=3)
    whole = life.frames(0, 30 * FPS)
    again = Life(FPS, seed=3).frames(190, 20)  # across a window's edge, drawn afresh
    np.testing.assert_array_equal(again.blendshapes, whole.blendshapes[190:210])
    np.testing.assert_array_equal(again.head_pose, whole.head_pose[190:210])
    steps = np.abs(np.diff(whole.head_pose, axis=0)).max(axis=1)
    assert steps.min() > 0 and np.degrees(steps.max()) < 0.5  # it moves, smoothly
    blinks = whole.blendshapes[:, ARKIT_INDEX["eyeBlinkLeft"]]
    assert 5 <= np.sum(np.diff((blinks > 0.5).astype(int)) == 1) <= 15  # 10-30 a minute


def test_speech_blends_in_and_out_without_a_jump():
    life = Life(FPS).frames(0, 40)
    speech = np.zeros((40, 52), np.float32)
    speech[:, JAW] = 1.0  # wide open for the spoken frames
    speaking = np.zeros(40, bool)
    speaking[10:25] = True
    mixed = Blend(FPS).mix(life, speech, speaking)
    jaw = mixed.blendshapes[:, JAW]
    assert jaw[:10].max() == 0 and jaw[20:25].min() == 1.0 and jaw[-5:].max() == 0
    assert np.abs(np.diff(jaw)).max() <= 0.21  # eased over 0.2 s: no jump


def test_the_caption_shows_the_question_in_its_band():
    frame = np.full((512, 512, 3), 60, np.uint8)
    caption = draw_caption("Ada asks: " + "why is the sky blue? " * 20, 512, 512)
    shown = caption.over(frame)
    np.testing.assert_array_equal(shown[: caption.top], frame[: caption.top])
    luma = shown.mean(axis=2)
    assert caption_probe(luma) > CAPTION_ON > caption_probe(frame.mean(axis=2))


def test_thinned_batches_fill_the_missing_frames_between_their_neighbours():
    drawn = np.stack([np.full((2, 2, 3), v, np.uint8) for v in (10, 30, 51)])
    frames = between_frames(drawn, [0, 2, 4], 5)
    assert frames[:, 0, 0, 0].tolist() == [10, 20, 30, 41, 51]  # rounded to the nearest
    # far behind the air, a batch is drawn at its last tick only, from the previous batch's
    sparse = between_frames(drawn[[2]], [4], 5, before=drawn[0])
    assert sparse[:, 0, 0, 0].tolist() == [18, 26, 35, 43, 51]
    with pytest.raises(ValueError, match="no frame before"):
        between_frames(drawn[[2]], [4], 5)


def test_the_stream_key_comes_from_the_environment_never_argv(tmp_path):
    from broadcast.onair import BroadcastError, output_url
    from broadcast.output import redact

    key = tmp_path / "key"
    key.write_text("live_123_secret\n")
    env = {"AVATAR_STREAM_KEY_FILE": str(key)}
    url = output_url("rtmp://live.twitch.tv/app", env)
    assert url == "rtmp://live.twitch.tv/app/live_123_secret"
    assert "secret" not in redact(url)
    assert output_url("rtmp://127.0.0.1/live/anchor", {}) == "rtmp://127.0.0.1/live/anchor"
    with pytest.raises(BroadcastError, match="AVATAR_STREAM_KEY_FILE"):
        output_url("rtmp://live.twitch.tv/app", {"AVATAR_STREAM_KEY_FILE": str(tmp_path / "no")})
