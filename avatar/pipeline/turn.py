"""One conversation turn, stage by stage, with LLM/TTS overlap, fallbacks and barge-in.

The LLM runs in a producer thread that queues each finished sentence; the calling thread
takes sentences from the queue and sends each through TTS, animation and rendering while
the LLM writes the next one. `cancelled()` (client gone or a newer turn on the session)
is checked between every step and stops both threads.

The reply is what a person listens to: each piece loses stage directions, emoji and markup
(`avatar.sentences.spoken_text`) before TTS and the caption, and the reply ends after
`PipelineConfig.max_sentences` sentences: the turn stops the LLM's generation there the
way a barge-in does (`Stages.cut`), so the session remembers only those sentences, whatever
backend writes them and whatever the model was asked. The face's emotion holds across
sentences and turns (`avatar.animation.emotion_hold`), per session in `Stages.moods`.

Knowledge: when `Stages.recall` is set, the user's words are looked up in the operator's
documents after ASR (stage "knowledge" in the timings) and the chosen passages travel to
the chat stage as `TurnRequest.context` (avatar/pipeline/prompt.py places them).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import queue
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple

import numpy as np

from avatar.animation.emotion_hold import DEFAULT_HOLD, HoldConfig, Mood, Moods, hold
from avatar.animation.pipeline import Animation, animate
from avatar.knowledge import Recall
from avatar.languages import turn_language
from avatar.pipeline.events import (
    FinalEvent,
    FramesEvent,
    SentenceEvent,
    TranscriptEvent,
    TurnEvent,
)
from avatar.pipeline.request import AUTO_EMOTION, Controls, TurnRequest
from avatar.sentences import ends_sentence, spoken_text

log = logging.getLogger(__name__)


@dataclasses.dataclass
class Speech:
    """One TTS response: float32 PCM and each phoneme's start/end (s) in that audio."""

    audio: np.ndarray
    sample_rate: int
    phonemes: list[str]
    starts: np.ndarray
    ends: np.ndarray
    text: str = ""  # the part of the sentence spoken (TTS may split a long sentence)


class Heard(NamedTuple):
    """What ASR heard: the words and Whisper's language code ("" when it does not say)."""

    text: str
    language: str = ""


@dataclasses.dataclass
class Stages:
    """The stage callables; the Triton adapter binds them to BLS calls.

    chat(user_text, request, stop) yields reply sentences and may return a stats dict
    (the generator's return value); it must poll `stop()` and end early when it is True.
    cut(request, spoken) is called once when a turn is cancelled after its reply began: it
    stops the LLM's generation for `request.turn_id` and tells it what was spoken, so the
    session remembers only that.
    """

    # audio -> the user's words, with the language Whisper heard them in when it says
    transcribe: Callable[[np.ndarray], str | Heard]
    chat: Callable[[str, TurnRequest, Callable[[], bool]], Iterator[str]]
    speak: Callable[[str, TurnRequest], Iterator[Speech]]
    # frames [T, H, W, 3] of blendshapes [T, 52] + head poses [T, 3] with the named face
    # ("" for the default); None when no renderer of that face is served
    render: Callable[[np.ndarray, np.ndarray, str], np.ndarray | None] | None = None
    # reply sentence -> (emotion label, confidence 0..1), for the "auto" emotion control
    feel: Callable[[str], tuple[str, float]] | None = None
    cut: Callable[[TurnRequest, str], None] | None = None
    # user's words -> the operator's passages for them (avatar.knowledge); None: no documents
    recall: Callable[[str], Recall] | None = None
    # the emotion each session's face last showed (hysteresis across turns); kept by this
    # process, bounded: a session served by another replica starts neutral
    moods: Moods = dataclasses.field(default_factory=Moods)


@dataclasses.dataclass(frozen=True)
class PipelineConfig:
    llm_timeout_s: float = 30.0  # longest wait for the LLM's next sentence
    fallback_reply: str = "Sorry, I need a moment. Could you say that again?"
    # the reply's sentence budget (0: none); a persona may set another
    max_sentences: int = 3
    hold: HoldConfig = DEFAULT_HOLD  # when the face's emotion may change
    # a later sentence goes to TTS once the audio already sent is at most this many
    # seconds ahead of its playback (which starts when the first audio is sent), so that
    # a turn's later sentences do not take the cores from other turns' first audio;
    # 0: each as soon as the LLM wrote it
    speak_ahead_s: float = 0.0


@dataclasses.dataclass
class _Clock:
    t0: float = dataclasses.field(default_factory=time.perf_counter)

    def ms(self) -> float:
        return round((time.perf_counter() - self.t0) * 1000.0, 1)


class _Timings:
    """`stage_ms`: wall time summed per stage (asr, knowledge, llm, tts, animation,
    render);
    `since_request_ms`: milestones (transcript, llm_first_sentence, first_audio,
    first_frame (blendshapes), first_video (rendered pixels), total) measured from the
    request's arrival."""

    def __init__(self, clock: _Clock):
        self.clock = clock
        self.stage: dict[str, float] = {}
        self.since: dict[str, float] = {}
        self.values: dict[str, Any] = {"stage_ms": self.stage, "since_request_ms": self.since}
        self._lock = threading.Lock()

    def add(self, stage: str, started: float) -> None:
        with self._lock:
            ms = (time.perf_counter() - started) * 1000.0
            self.stage[stage] = round(self.stage.get(stage, 0.0) + ms, 1)

    def mark(self, *milestones: str) -> None:
        now = self.clock.ms()
        with self._lock:
            for milestone in milestones:
                self.since.setdefault(milestone, now)


_DONE = object()


@dataclasses.dataclass
class _Turn:
    request: TurnRequest
    stages: Stages
    timings: _Timings
    errors: list[str]
    hold: HoldConfig = DEFAULT_HOLD
    mood: Mood = dataclasses.field(
        default_factory=Mood
    )  # what the face shows now (updated per sentence)


class _LlmProducer(threading.Thread):
    """Runs `chat` and queues the spoken text of each piece; ends with _DONE (or the
    exception). After `max_sentences` sentences it stops reading and cuts the generation."""

    def __init__(
        self, stages: Stages, text: str, request: TurnRequest, stop, timings, *, max_sentences: int
    ):
        super().__init__(name="avatar-llm", daemon=True)
        self.stages, self.text, self.request = stages, text, request
        self.timings, self.max_sentences = timings, max_sentences
        self.full = False  # the budget is spent: read no more, the generation was cut
        self.stop = lambda: self.full or stop()
        # what the LLM stage polls: after the budget's cut its stream ends by itself with its
        # stats (a stage that cannot be cut is stopped by the flag)
        self.chat_stop = lambda: stop() or (self.full and stages.cut is None)
        self.sentences: queue.Queue = queue.Queue()
        self.stats: dict[str, Any] = {}
        self.errors: list[str] = []

    def run(self) -> None:
        started = time.perf_counter()
        queued: list[str] = []
        try:
            stream = self.stages.chat(self.text, self.request, self.chat_stop)
            while True:
                try:
                    sentence = next(stream)
                except StopIteration as end:
                    self.stats = end.value or {}
                    break
                if self.stop():
                    continue  # drained, not closed: the stage's stream ends by itself
                text = spoken_text(sentence)
                if not text:  # "(laughs)", "😊": nothing to say, and not a sentence spent
                    log.debug("skipped a reply piece with nothing to speak: %r", sentence)
                    continue
                self.timings.mark("llm_first_sentence")
                self.sentences.put(text)
                queued.append(text)
                if self.max_sentences and sum(map(ends_sentence, queued)) >= self.max_sentences:
                    self._spend(" ".join(queued))
            self.sentences.put(_DONE)
        except Exception as error:  # reported in the final event by the consumer
            self.sentences.put(error)
        finally:
            self.timings.add("llm", started)

    def _spend(self, reply: str) -> None:
        """The budget is spent: stop the generation now (not after the queued sentences
        are spoken) and keep `reply` as the answer; a later barge-in corrects it again."""
        self.full = True
        if self.stages.cut is not None:
            _cut(self.stages, self.request, reply, self.errors)


def run_turn(
    request: TurnRequest,
    stages: Stages,
    emit: Callable[[TurnEvent], None],
    cancelled: Callable[[], str],
    config: PipelineConfig = PipelineConfig(),
    *,
    settled: Callable[[], None] = lambda: None,
) -> FinalEvent:
    """Run one turn, calling `emit` for each event as soon as it exists; returns the final
    event (also emitted). `cancelled()` returns "" or why the turn must stop. `settled()`
    blocks until the session's previous turn has ended (so the memory this turn's LLM reads
    holds only what that turn spoke); it is called after ASR, before the LLM starts."""
    clock = _Clock()
    timings = _Timings(clock)
    errors: list[str] = []
    said: list[str] = []
    transcript, heard_language = request.text, request.controls.language
    reason = ""
    if request.audio is not None:
        started = time.perf_counter()
        heard = stages.transcribe(request.audio)  # a failure fails the turn
        heard = heard if isinstance(heard, Heard) else Heard(heard)
        transcript, heard_language = heard.text.strip(), heard.language or heard_language
        timings.add("asr", started)
    # the reply is asked for, and its sentences spoken, in the user's language
    request = dataclasses.replace(request, language=turn_language(transcript, heard_language))
    turn = _Turn(
        request, stages, timings, errors, config.hold, stages.moods.get(request.session_id)
    )
    emit(TranscriptEvent(transcript))
    timings.mark("transcript")

    stop_llm = threading.Event()
    producer = None
    if transcript and not cancelled() and stages.recall is not None:
        # before settled(): the lookup overlaps the end of a superseded turn
        request = _with_knowledge(transcript, request, stages.recall, timings, errors)
    if transcript and not cancelled():
        settled()
        producer = _LlmProducer(
            stages,
            transcript,
            request,
            lambda: stop_llm.is_set() or bool(cancelled()),
            timings,
            max_sentences=config.max_sentences,
        )
        producer.start()
    llm_failed: list[str] = []  # set when the LLM timed out or failed mid-reply
    sentences = _sentences(producer, config, errors, cancelled, llm_failed)
    position = 0.0  # turn clock (s)
    index = 0
    playback = _Playback(config.speak_ahead_s)
    for text in sentences:
        reason = cancelled()
        if reason:
            break
        playback.wait(position, cancelled)
        for event in _speak_sentence(text, index, position, turn):
            if cancelled():
                break
            emit(event)  # the voice and the face's blendshapes go out before any pixels
            timings.mark(*_firsts(event))
            playback.started(event)
            said.append(event.text)
            position += event.duration
            index += 1
            frames = _rendered(event, turn)
            if frames is not None and not cancelled():
                emit(frames)
                timings.mark("first_video")
    reason = reason or cancelled()
    stop_llm.set()
    stages.moods.put(request.session_id, turn.mood)
    # a cancelled turn, or an LLM that timed out or failed: stop its generation and keep
    # in the session only what was spoken (e.g. the fallback reply)
    if (reason or llm_failed) and producer is not None and stages.cut is not None:
        _cut(stages, request, " ".join(said), errors)
    if producer is not None:
        producer.join(timeout=1.0)  # a drained stream may run on
        errors.extend(producer.errors)
        if producer.stats:
            memory_error = producer.stats.pop("memory_error", "")
            if memory_error:  # answered, but this turn may be forgotten
                errors.append(f"memory: {memory_error}")
            producer.stats.pop("session_id", None)  # the final response carries it
            timings.values["llm_stats"] = producer.stats
    timings.mark("total")
    timings.values.update(sentences=index, audio_s=round(position, 3), language=request.language)
    if playback.waited_s:
        timings.values["paced_ms"] = round(playback.waited_s * 1000.0, 1)
    final = FinalEvent(
        transcript, " ".join(said), reason, errors, timings.values, request.session_id
    )
    emit(final)
    return final


class _Playback:
    """The listener's playback of the turn's audio, as the turn sees it: it starts when the
    first audio is sent. `wait(position)` holds the next sentence until the audio sent
    (up to `position` s on the turn clock) is at most `ahead_s` ahead of it."""

    def __init__(self, ahead_s: float) -> None:
        self.ahead_s = ahead_s
        self.t0: float | None = None  # when the first audio went out
        self.waited_s = 0.0

    def started(self, event: SentenceEvent) -> None:
        if self.t0 is None and event.audio.size:
            self.t0 = time.perf_counter()

    def lead(self, position: float) -> float:
        """Seconds of sent audio not yet played."""
        return 0.0 if self.t0 is None else position - (time.perf_counter() - self.t0)

    def wait(self, position: float, cancelled: Callable[[], str]) -> None:
        if self.ahead_s <= 0 or self.t0 is None:
            return
        started = time.perf_counter()
        while not cancelled():
            early = self.lead(position) - self.ahead_s
            if early <= 0:
                break
            time.sleep(min(early, 0.05))  # short: a barge-in is seen within 50 ms
        self.waited_s += time.perf_counter() - started


def _with_knowledge(
    text: str,
    request: TurnRequest,
    recall: Callable[[str], Recall],
    timings: _Timings,
    errors: list[str],
) -> TurnRequest:
    """The request with the passages for `text` as its context; a failed lookup is an error
    of the turn, which is answered without documents."""
    started = time.perf_counter()
    try:
        found = recall(text)
    except Exception as error:
        errors.append(f"knowledge: {error}")
        log.warning("knowledge lookup failed; answering without documents: %s", error)
        return request
    finally:
        timings.add("knowledge", started)
    timings.values["knowledge"] = found.summary()
    return dataclasses.replace(request, context=found.context)


def _cut(stages: Stages, request: TurnRequest, spoken: str, errors: list[str]) -> None:
    try:
        stages.cut(request, spoken)
    except Exception as error:  # the turn still ends; the LLM runs on to max_tokens
        errors.append(f"llm: could not stop the generation: {error}")
        log.warning("could not stop the LLM of turn %s: %s", request.turn_id, error)


def _firsts(event: SentenceEvent) -> list[str]:
    return ["first_audio"] * bool(event.audio.size) + ["first_frame"] * bool(len(event.blendshapes))


def _sentences(
    producer, config: PipelineConfig, errors: list[str], cancelled, failed: list[str]
) -> Iterator[str]:
    """Sentences from the LLM thread; the fallback reply when it times out or fails first."""
    if producer is None:
        if not cancelled():
            errors.append("asr: nothing was heard; no reply")
        return
    got, last = 0, time.perf_counter()
    while not cancelled():
        try:
            item = producer.sentences.get(timeout=min(config.llm_timeout_s, 0.1))
        except queue.Empty:
            if time.perf_counter() - last < config.llm_timeout_s:
                continue
            item = TimeoutError(f"no sentence within {config.llm_timeout_s:g} s")
        last = time.perf_counter()
        if item is _DONE:
            return
        if isinstance(item, Exception):
            errors.append(f"llm: {item}")
            failed.append(str(item))
            if got == 0:
                errors.append("llm: answered with the configured fallback reply")
                yield from [config.fallback_reply] if config.fallback_reply.strip() else []
            return
        if not any(c.isalnum() for c in item):
            # an LLM piece with nothing to say ("🍎💡"): the TTS would refuse it, and a turn
            # that spoke every word would report an error
            log.debug("skipped a reply piece with no letter or digit: %r", item)
            continue
        got += 1
        yield item


def _speak_sentence(text: str, index: int, position: float, turn: _Turn) -> Iterator[SentenceEvent]:
    """TTS -> animation -> frames for one sentence, each TTS piece as soon as it is
    synthesised; a TTS failure before the first piece yields text with an error. The
    sentence's emotion is classified beside its synthesis (it needs only the text)."""
    request, stages, timings, errors = turn.request, turn.stages, turn.timings, turn.errors
    controls = request.controls
    feeling = _feel_beside(text, turn)
    pieces = iter(stages.speak(text, request))
    number = 0
    while True:
        started = time.perf_counter()
        try:
            speech = next(pieces)
        except StopIteration:
            return
        except Exception as error:
            message = f"tts: {error}"
            errors.append(message)
            log.warning("sentence %d without audio: %s", index + number, message)
            if number == 0:  # nothing of it was spoken: its text still reaches the caption
                yield _text_only(text, index, position, controls, message)
            return
        finally:
            timings.add("tts", started)
        part = speech.text or text
        yield _animated(part, index + number, position, speech, turn, feel=feeling)
        position += _padded_samples(speech, controls.fps) / speech.sample_rate
        number += 1


_FEELINGS = ThreadPoolExecutor(max_workers=4, thread_name_prefix="emotion")


def _feel_beside(text: str, turn: _Turn) -> Callable[[str], tuple[str, float]] | None:
    """`feel` for the sentence's pieces, the whole sentence's answer started now so that it
    runs while the sentence is synthesised (a piece with other text asks for itself)."""
    feel = turn.stages.feel
    if feel is None or turn.request.controls.emotion != AUTO_EMOTION or not text.strip():
        return feel
    future = _FEELINGS.submit(feel, text)
    return lambda piece: future.result() if piece == text else feel(piece)


def _padded_samples(speech: Speech, fps: float) -> int:
    frames = max(1, math.ceil(speech.audio.size / speech.sample_rate * fps - 1e-9))
    return round(frames * speech.sample_rate / fps)


def _animated(
    text: str,
    index: int,
    position: float,
    speech: Speech,
    turn: _Turn,
    *,
    feel: Callable[[str], tuple[str, float]] | None,
) -> SentenceEvent:
    """Pad the audio to whole frames so every sentence starts on a frame of the turn clock."""
    request, timings = turn.request, turn.timings
    controls = request.controls
    samples = _padded_samples(speech, controls.fps)
    audio = np.zeros(samples, np.float32)
    audio[: min(samples, speech.audio.size)] = speech.audio[:samples]
    frames = round(samples * controls.fps / speech.sample_rate)
    started = time.perf_counter()
    try:
        controls, turn.mood = held_emotion(text, controls, feel, turn.mood, turn.hold)
    except Exception as error:  # the face goes neutral; audio and animation still go
        turn.errors.append(f"emotion: {error}")
        controls = sentence_emotion(text, controls, None)
    phonemes = list(zip(speech.phonemes, speech.starts.tolist(), speech.ends.tolist(), strict=True))
    animation = animate(
        phonemes, controls.animation(t0=position), text=text, duration=frames / controls.fps
    )
    timings.add("animation", started)
    blendshapes, pose = animation.blendshapes[:frames], animation.head_pose[:frames]
    return SentenceEvent(
        index=index,
        text=text,
        emotion=controls.emotion,
        start=round(position, 6),
        audio=audio,
        sample_rate=speech.sample_rate,
        fps=controls.fps,
        blendshapes=blendshapes,
        head_pose=pose,
        animation=animation_json(animation, controls),
    )


def _rendered(event: SentenceEvent, turn: _Turn) -> FramesEvent | None:
    """The sentence's frames drawn by the face the request names, or None (not asked for,
    no renderer served, nothing to draw, or the renderer failed: the turn goes on)."""
    stages, controls = turn.stages, turn.request.controls
    if stages.render is None or not controls.render or not len(event.blendshapes):
        return None
    started = time.perf_counter()
    try:
        video = stages.render(event.blendshapes, event.head_pose, controls.face)
    except Exception as error:  # frames are optional: audio and blendshapes went out
        turn.errors.append(f"render: {error}")
        log.warning("sentence %d without video: %s", event.index, error)
        return None
    finally:
        turn.timings.add("render", started)
    return None if video is None else FramesEvent(event.index, event.start, event.fps, video)


def sentence_emotion(
    text: str, controls: Controls, feel: Callable[[str], tuple[str, float]] | None
) -> Controls:
    """Controls with a concrete emotion: "auto" takes the sentence's own (its confidence
    scaled by the `intensity` control), or neutral where no classifier is served."""
    if controls.emotion != AUTO_EMOTION:
        return controls
    if feel is None or not text.strip():
        return dataclasses.replace(controls, emotion="neutral", intensity=0.0)
    label, confidence = feel(text)
    return dataclasses.replace(controls, emotion=label, intensity=controls.intensity * confidence)


def held_emotion(
    text: str,
    controls: Controls,
    feel: Callable[[str], tuple[str, float]] | None,
    mood: Mood,
    config: HoldConfig = DEFAULT_HOLD,
) -> tuple[Controls, Mood]:
    """`sentence_emotion` with hysteresis: "auto" shows the mood held from the previous
    sentences (of this turn and the session's earlier ones), changed only as
    `emotion_hold.hold` allows; returns the controls and the new mood."""
    if controls.emotion != AUTO_EMOTION:
        return controls, mood
    if feel is None or not text.strip():
        return sentence_emotion(text, controls, None), mood
    label, confidence = feel(text)
    mood = hold(mood, label, confidence, config)
    shown = dataclasses.replace(
        controls, emotion=mood.label, intensity=controls.intensity * mood.level
    )
    return shown, mood


def animation_json(animation: Animation, controls: Controls) -> dict[str, Any]:
    """Visemes, gestures, blinks (s) and the emotion, as clients receive them (JSON)."""
    return {
        "visemes": animation.viseme_track(),
        "gestures": [dataclasses.asdict(g) for g in animation.gestures],
        "blinks": animation.blinks,
        "emotion": {"label": controls.emotion, "intensity": controls.intensity},
    }


def _text_only(text: str, index: int, position: float, controls, error: str) -> SentenceEvent:
    return SentenceEvent(
        index=index,
        text=text,
        emotion=controls.emotion,
        start=round(position, 6),
        audio=np.zeros(0, np.float32),
        sample_rate=0,
        fps=controls.fps,
        blendshapes=np.zeros((0, 52), np.float32),
        head_pose=np.zeros((0, 3), np.float32),
        animation={},
        error=error,
    )
