"""Live audio for `clients.chat`: a microphone cut into utterances by the served `vad`
model, and a speaker that plays reply sentences as they stream in.

Both use `sounddevice` (PortAudio), which is optional: `pip install sounddevice` and
Debian's `libportaudio2` on a machine with a sound card. The utterance cutting itself
(`listen`) takes any chunk source, so it runs and is tested on recorded audio too.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Iterable, Iterator

import numpy as np
import tritonclient.grpc as grpcclient

from avatar.endpointing import Endpointer
from avatar.vad import CHUNK, SAMPLE_RATE, VadStream
from clients.vad_stream import infer

log = logging.getLogger(__name__)


def _sounddevice():
    try:
        import sounddevice
    except (ImportError, OSError) as error:  # OSError: the PortAudio library is missing
        raise RuntimeError(
            f"live audio needs sounddevice and PortAudio ({error}); install them with "
            "`pip install sounddevice` and `apt-get install libportaudio2`, or pass a WAV file"
        ) from None
    return sounddevice


def microphone_chunks(device: str | int | None = None) -> Iterator[np.ndarray]:
    """16 kHz mono float32 chunks [512] from the default (or given) input device; raises
    RuntimeError at once when there is no audio library."""
    return _record(_sounddevice(), device)


def _record(sounddevice, device: str | int | None) -> Iterator[np.ndarray]:
    chunks: queue.Queue[np.ndarray] = queue.Queue()

    def on_audio(data: np.ndarray, frames: int, time, status) -> None:
        if status:
            log.warning("microphone: %s", status)
        chunks.put(data[:, 0].copy())

    with sounddevice.InputStream(
        samplerate=SAMPLE_RATE,
        channels=1,
        dtype="float32",
        blocksize=CHUNK,
        device=device,
        callback=on_audio,
    ):
        while True:
            yield chunks.get()


def listen(
    url: str,
    chunks: Iterable[np.ndarray],
    endpointer: Endpointer | None = None,
    model: str = "vad",
) -> np.ndarray | None:
    """The next utterance [samples] at 16 kHz from `chunks` (each [512]), its end found by
    the served VAD model; None when the source ends first."""
    endpointer = endpointer or Endpointer()
    stream = VadStream()
    with grpcclient.InferenceServerClient(url) as client:
        for raw in chunks:
            chunk = np.asarray(raw, np.float32).reshape(CHUNK)
            prob = stream.update(infer(client, model, stream.inputs(chunk[None])))[0]
            utterance = endpointer.push(chunk, float(prob))
            if utterance is not None:
                return utterance
    return None


class Speaker:
    """Plays reply sentences in order as they arrive, on a thread of its own."""

    def __init__(self, device: str | int | None = None):
        self.sounddevice = _sounddevice()
        self.device = device
        self.queue: queue.Queue[tuple[np.ndarray, int] | None] = queue.Queue()
        self.thread = threading.Thread(target=self._play, name="speaker", daemon=True)
        self.thread.start()

    def on_response(self, response: dict) -> None:
        """A `stream_turn` callback: queue each sentence's audio."""
        if response.get("kind") == "sentence" and response["audio"].size:
            self.queue.put((response["audio"], int(response["sample_rate"])))

    def close(self) -> None:
        """Wait until everything queued has been played."""
        self.queue.put(None)
        self.thread.join()

    def _play(self) -> None:
        while (item := self.queue.get()) is not None:
            audio, rate = item
            self.sounddevice.play(audio, rate, device=self.device, blocking=True)
