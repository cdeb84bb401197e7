"""The live page in a real browser (Debian's Chromium, headless, through WebDriver): its
microphone is a WAV file (Chromium's fake capture device), so the whole path runs as a
user's would: getUserMedia -> AudioWorklet -> WebSocket -> gateway -> vad + avatar on the
real tritonserver -> Web Audio playback and the face drawn from the ARKit frames."""

from __future__ import annotations

import shutil
import time
import wave
from pathlib import Path

import numpy as np
import pytest

from export.asr.clips import clips
from export.asr.wer import wer

CHROMIUM, DRIVER = shutil.which("chromium"), shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(
    not (CHROMIUM and DRIVER), reason="needs chromium and chromium-driver (make test installs them)"
)


def _microphone_wav(path: Path, audio: np.ndarray) -> Path:
    """1 s of silence, the question, then 40 s of silence (Chromium loops the file)."""
    rate = 16_000
    signal = np.concatenate([np.zeros(rate, np.float32), audio, np.zeros(40 * rate, np.float32)])
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes((np.clip(signal, -1, 1) * 32767).astype("<i2").tobytes())
    return path


def test_a_spoken_question_is_answered_in_the_browser(gateway: str, tmp_path: Path) -> None:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    clip = clips()[1]  # "What time does the museum open on Sunday?"
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--use-fake-ui-for-media-stream",
        "--use-fake-device-for-media-stream",
        f"--use-file-for-fake-audio-capture={_microphone_wav(tmp_path / 'mic.wav', clip.audio)}",
        "--autoplay-policy=no-user-gesture-required",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(DRIVER), options=options)
    try:
        driver.get(gateway + "/")
        driver.find_element("id", "start").click()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            stats = driver.execute_script("return window.liveStats")
            if stats["errors"] or stats["turnEnds"]:
                break
            time.sleep(0.5)
        time.sleep(2.0)  # the reply plays; the face moves with it
        stats = driver.execute_script("return window.liveStats")
        logs = driver.get_log("browser") if hasattr(driver, "get_log") else []
    finally:
        driver.quit()
    assert not stats["errors"], (stats["errors"], logs)
    assert stats["ready"] and stats["turnEnds"], stats
    assert wer(clip.text, stats["transcripts"][0]) < 0.2, stats["transcripts"]
    assert stats["sentences"] >= 1 and stats["audioChunks"] >= 1 and stats["framesChunks"] >= 1
    assert stats["framesDrawn"] > 10, "the face was not driven by the reply's frames"
    assert stats["firstAudioMs"] and 0 < stats["firstAudioMs"][0] < 60_000
