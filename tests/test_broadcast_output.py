"""The broadcast's output layer against a real nginx-rtmp server: a signal card (a moving
picture with its tick number drawn in, tone bursts at known ticks) pushed in real time by
`PacedOutput`, played back from the server while it is live, and measured by
`broadcast.readback`: every tick arrives once with its own timestamp, no frame gap, no
frozen frame, audio on the video's timeline, each burst heard where it was sent."""

from __future__ import annotations

import json
import logging
import re
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from rtmp_server import RtmpServer, free_port, rtmp_server  # noqa: F401  (the fixture)

from broadcast.clock import StreamClock
from broadcast.output import AVOutput, OutputError, PacedOutput, StreamFormat, container_format
from broadcast.readback import CARD_TONE, Readback, SignalCard, card_probe, card_tick

log = logging.getLogger(__name__)
FPS = 25


def _wait_for_player(server: RtmpServer, timeout_s: float = 10.0) -> None:
    """nginx logs a `play:` line once the read-back has subscribed to the stream."""
    deadline = time.monotonic() + timeout_s
    while "play: name=" not in server.error_log():
        if time.monotonic() > deadline:
            raise AssertionError("the read-back never subscribed:\n" + server.error_log())
        time.sleep(0.05)


def _broadcast(server: RtmpServer, seconds: float, card: SignalCard) -> tuple[Readback, dict]:
    """Push `seconds` of the card through PacedOutput while a Readback plays the stream."""
    url = server.url("card")
    readback = Readback(url, probe=card_probe, fps_hint=FPS)
    reader = threading.Thread(target=readback.run, kwargs={"seconds": seconds + 30})
    reader.start()
    _wait_for_player(server)
    fmt = StreamFormat(fps=FPS)
    paced = PacedOutput(AVOutput(url, fmt))
    ticks = round(seconds * FPS)
    cpu0, wall0 = time.process_time(), time.monotonic()
    starts = set(card.tone_starts(ticks))
    for tick in range(ticks):
        if tick == 4:  # a few ticks ahead, as the show renders ahead
            paced.start()
        mark = f"tone{tick}" if tick in starts else None
        paced.put(card.frame(tick), card.audio(tick), mark=mark, timeout=5)
    paced.close()
    cpu_per_s = (time.process_time() - cpu0) / (time.monotonic() - wall0)
    reader.join(timeout=15)  # the read-back ends when the stream stops (its idle timeout)
    assert not reader.is_alive(), "the read-back did not end after the stream did"
    sent = {
        "ticks": ticks,
        "paced": paced.stats,
        "output": paced.output.stats,
        "cpu_per_s": cpu_per_s,
        "marks": {f"tone{t}": paced.mark_times(f"tone{t}") for t in starts},
    }
    return readback, sent


def _check_received(readback: Readback, sent: dict, card: SignalCard) -> dict:
    ticks = sent["ticks"]
    report = readback.report()
    log.info("received: %s", report)
    log.info("sent: %s; cpu %.3f s/s", sent["output"], sent["cpu_per_s"])
    assert sent["paced"].underflows == 0, sent["paced"]
    # Every tick arrived, once, stamped with its own tick: the number drawn in the picture.
    drawn = [card_tick(f.probe) for f in readback.frames]
    stamped = [round(f.pts_s * FPS) for f in readback.frames]
    assert drawn == stamped
    assert drawn == list(range(ticks)), (
        f"missing or extra ticks: {sorted(set(range(ticks)) - set(drawn))[:10]}"
    )
    assert report.max_frame_gap_intervals <= 2.0
    assert report.longest_frozen_run == 1
    assert abs(report.fps - FPS) < 0.01
    assert report.audio_gap_max_ms < 1.0  # silence is samples, never a hole (ms rounding: FLV)
    assert report.av_offset_max_ms <= 40.0
    assert abs(report.audio_s - ticks / FPS) < 0.05
    # Each burst is heard where it was sent, and lit in the same frame as it starts.
    lit = readback.video_onsets(above=CARD_TONE - 0.5)
    starts = card.tone_starts(ticks)
    assert lit == pytest.approx([t / FPS for t in starts])
    delays = []
    for tick in starts:
        heard = readback.audio_onset(tick / FPS - 0.5)
        assert heard is not None and abs(heard - tick / FPS) <= 1 / FPS, (tick, heard)
        times = sent["marks"][f"tone{tick}"]
        received = readback.audio_received_at(heard)
        assert times is not None and times.audio_out is not None and received is not None
        assert times.written <= times.audio_out <= received
        assert readback.opened_at is not None and readback.opened_at < received
        delays.append((times.audio_out - times.written, received - times.audio_out))
    figures = {
        "encoder_ms": [round(e * 1000, 1) for e, _ in delays],
        "server_ms": [round(s * 1000, 1) for _, s in delays],
        "report": report,
    }
    log.info(
        "tone bursts: encoder buffering %s ms, server+network %s ms", *list(figures.values())[:2]
    )
    return figures


def test_card_through_nginx_rtmp(rtmp_server: RtmpServer) -> None:  # noqa: F811
    card = SignalCard(tone_period_ticks=150, tone_start_tick=75, tone_ticks=20)
    readback, sent = _broadcast(rtmp_server, 14.0, card)
    figures = _check_received(readback, sent, card)
    # Received in real time: nothing arrives in bursts longer than a few frames.
    assert figures["report"].max_receive_gap_s < 1.0


@pytest.mark.slow
def test_ten_minutes_through_nginx_rtmp(rtmp_server: RtmpServer) -> None:  # noqa: F811
    card = SignalCard()
    readback, sent = _broadcast(rtmp_server, 600.0, card)
    figures = _check_received(readback, sent, card)
    assert abs(figures["report"].av_offset_ms) <= 40.0


def _ffprobe(path: Path, *entries: str) -> dict:
    command = ["ffprobe", "-v", "error", "-of", "json", "-count_frames"]
    command += ["-show_entries", ",".join(entries), str(path)]
    return json.loads(subprocess.run(command, check=True, capture_output=True, text=True).stdout)


@pytest.mark.parametrize("suffix", [".flv", ".ts"])
def test_file_output_and_hls_preview(tmp_path: Path, suffix: str) -> None:
    card = SignalCard(tone_period_ticks=50, tone_start_tick=25, tone_ticks=10)
    path = tmp_path / f"card{suffix}"
    output = AVOutput(str(path), StreamFormat(fps=FPS), preview_dir=tmp_path / "hls")
    for tick in range(3 * FPS):
        output.write(card.frame(tick), card.audio(tick))
    output.close()
    streams = _ffprobe(path, "stream=codec_name,r_frame_rate,sample_rate,channels,nb_read_frames")[
        "streams"
    ]
    video = next(s for s in streams if s["codec_name"] == "h264")
    audio = next(s for s in streams if s["codec_name"] == "aac")
    assert video["r_frame_rate"] == "25/1" and int(video["nb_read_frames"]) == 3 * FPS
    assert audio["sample_rate"] == "48000" and audio["channels"] == 1
    # The first audio and video packets share time 0: the AAC priming packet is dropped.
    packets = _ffprobe(path, "packet=stream_index,pts_time")["packets"]
    first = {p["stream_index"]: float(p["pts_time"]) for p in reversed(packets)}
    assert set(first.values()) == {first[0]} and abs(first[0] - first[1]) < 1e-3
    readback = Readback(str(path), probe=card_probe)
    readback.run()
    assert [card_tick(f.probe) for f in readback.frames] == list(range(3 * FPS))
    assert readback.audio_onset(0.0) == pytest.approx(1.0, abs=1 / FPS)
    # The preview is HLS of the same packets: 2 s segments cut on keyframes.
    playlist = (tmp_path / "hls" / "index.m3u8").read_text()
    assert re.findall(r"#EXTINF:([\d.]+)", playlist)[0] == "2.000000"
    preview = _ffprobe(tmp_path / "hls" / "index.m3u8", "stream=codec_name")["streams"]
    assert {s["codec_name"] for s in preview} == {"h264", "aac"}


def test_refused_connection_names_the_url_not_the_key() -> None:
    url = f"rtmp://127.0.0.1:{free_port()}/live/secret-stream-key"
    with pytest.raises(OutputError) as refused:
        AVOutput(url, StreamFormat(), open_timeout_s=3)
    message = str(refused.value)
    assert f"{url.rsplit('/', 1)[0]}/<key>" in message and "secret-stream-key" not in message


def test_bad_input_is_refused_with_what_is_expected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="samples per frame"):
        StreamClock(24, 44100)
    with pytest.raises(ValueError, match=r"rtmp://.*\.flv or \.ts"):
        container_format(str(tmp_path / "out.mp4"))
    with pytest.raises(ValueError, match="preset"):
        StreamFormat(preset="placebo")
    output = AVOutput(str(tmp_path / "x.flv"), StreamFormat())
    with pytest.raises(ValueError, match="512x512x3 uint8"):
        output.write(np.zeros((256, 256, 3), np.uint8), np.zeros(1920, np.float32))
    with pytest.raises(ValueError, match="1920 float32"):
        output.write(np.zeros((512, 512, 3), np.uint8), np.zeros(1024, np.float32))
    output.close()


def test_clock_stamps_from_ticks() -> None:
    clock = StreamClock(30, 48000)
    assert clock.samples_per_frame == 1600 and clock.media_time(90) == 3.0
    assert clock.tick_at(clock.media_time(12345)) == 12345
    clock.start(at=100.0)
    assert clock.due(25) == pytest.approx(100.0 + 25 / 30)
    assert clock.lateness(30, now=101.5) == pytest.approx(0.5)
