"""The show: one broadcast as one loop on one clock. Tick n is frame n and audio samples
n * samples_per_frame onwards; every tick is rendered, never repeated, and carries audio
(real silence when the anchor is quiet).

Two tasks share the programme (broadcast.programme):

- the host takes the chat queue's next question, says whose question it is (the served
  `avatar_say`, with a smile) while the served `avatar` model already thinks about the
  answer, and queues each reply sentence as it arrives, so the first sentence goes on air
  while the next ones are still being written;
- the renderer takes a few ticks at a time from the programme, blends the speech into the
  anchor's idle life (broadcast.life), renders them on the server (one batched request),
  lays the question's caption over them and hands them to the output, whose small queue
  (PacedOutput) is how far the show renders ahead of the air.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import itertools
import logging
import time
from typing import Any, Protocol

import numpy as np

from avatar.pipeline.events import FinalEvent, SentenceEvent
from broadcast.anchor import Anchor, Speech
from broadcast.captions import Caption, draw_caption
from broadcast.chat.messages import Question
from broadcast.chat.queue import ChatQueue
from broadcast.life import Blend, Life, Pose, with_smile
from broadcast.output import OutputError
from broadcast.programme import Programme, Segment, stream_speech
from gateway.triton_client import TurnCall, TurnError

log = logging.getLogger(__name__)

RENDER_TICKS = 5  # ticks rendered per request: 0.2 s at 25 fps
WARM_UP_BATCHES = 3
RENDER_RETRY_S = 0.5
CAPTION_HOLD_S = 1.5  # the caption stays up this long after the answer's last word
ANSWER_IDLE_TIMEOUT_S = 60.0  # a turn that sends nothing this long is given up
PAUSE_AFTER_ANSWER_S = 0.6  # breath between one answer and the next question
SMILE = 0.55


class Output(Protocol):
    """Where ticks go (broadcast.output.PacedOutput): `start` starts its clock at tick 0,
    `put_async` waits for room in its small queue; a `mark` names a tick for `mark_times`.
    A tick due with nothing queued repeats the last frame (an underflow): the output's tick
    numbers then run ahead of the show's."""

    def start(self) -> None: ...

    @property
    def queued(self) -> int: ...  # ticks waiting to be written

    @property
    def underflows(self) -> int: ...  # ticks written with nothing queued

    async def put_async(
        self, frame: np.ndarray, audio: np.ndarray, mark: str | None = None
    ) -> None: ...


@dataclasses.dataclass
class QuestionRecord:
    """One question's way through the show; times are time.monotonic(), ticks are the
    show's (media time = tick / fps until an underflow: the output's own tick of each first
    naming and answer tick is in its `mark_times(mark_of(id, kind))`)."""

    id: int
    text: str
    viewers: tuple[str, ...]
    source: str  # where it was asked: "http", "ws", "irc"
    posted: float  # when the first viewer's message reached the queue
    picked: float = 0.0  # when the show took it from the queue
    said: float = 0.0  # when the attribution's speech was ready
    first_sentence: float = 0.0  # when the answer's first sentence was ready
    attribution_tick: int | None = None  # the first tick of the attribution on the stream
    answer_tick: int | None = None  # the first tick of the answer's audio
    answer_rendered: float = 0.0  # when that tick was handed to the output
    end_tick: int | None = None
    sentences: int = 0
    reply: str = ""
    error: str = ""

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class Show:
    """`anchor`: the Triton calls; `queue`: the moderated chat; `output`: the paced
    encoder; `width` x `height` at `fps`, audio at `sample_rate`."""

    def __init__(
        self,
        anchor: Anchor,
        queue: ChatQueue,
        output: Output,
        *,
        fps: float = 25.0,
        width: int = 512,
        height: int = 512,
        sample_rate: int = 48000,
        seed: int = 0,
        prefill_ticks: int = RENDER_TICKS,
        low_water_ticks: int = 0,
    ) -> None:
        """`prefill_ticks`: rendered before the output's clock starts (at most its queue);
        `low_water_ticks`: with fewer ticks queued, every other frame is rendered, and under
        half of it only the last of each batch (`_rows_to_draw`)."""
        self.anchor, self.queue, self.output = anchor, queue, output
        self.fps, self.width, self.height, self.sample_rate = fps, width, height, sample_rate
        self.samples_per_frame = round(sample_rate / fps)
        if self.samples_per_frame * fps != sample_rate:
            raise ValueError(f"{sample_rate} Hz is not a whole number of samples per frame")
        self.programme = Programme(self.samples_per_frame)
        self.life = Life(fps, seed)
        self.blend = Blend(fps)
        self.tick = 0  # the next tick to render
        self.prefill_ticks, self.low_water_ticks = prefill_ticks, low_water_ticks
        self.thinned_batches = 0  # batches drawn at a fraction of the render cost (low water)
        self.sparse_batches = 0  # ...of them, drawn at their last tick only
        self._last_drawn: np.ndarray | None = None  # the renderer's latest frame
        self._on_air = False  # the output's clock runs: ticks have deadlines
        # the latest questions and render times (a broadcast may run for days)
        self.records: collections.deque[QuestionRecord] = collections.deque(maxlen=500)
        self.render_s: collections.deque[float] = collections.deque(maxlen=1500)
        self._caption: Caption | None = None
        self._caption_until: int | None = None  # tick the caption comes down at
        self._aired: dict[int, asyncio.Event] = {}  # question id -> its last segment handed on
        self._marked: set[tuple[int, str]] = set()  # (question, kind) whose first tick is marked

    # the host: questions in, speech out
    async def host(self) -> None:
        """Answer the queue's questions one after another, until cancelled."""
        while True:
            question = await self.queue.next_question()
            try:
                await self.answer(question)
            except asyncio.CancelledError:
                raise
            except Exception:  # one question's failure never ends the show
                log.exception("question %d failed", question.id)
            await asyncio.sleep(PAUSE_AFTER_ANSWER_S)

    async def answer(self, question: Question) -> QuestionRecord:
        """Say whose question it is, answer it, and return once the answer is on its way
        to the air (handed to the output)."""
        record = QuestionRecord(
            question.id,
            question.text,
            question.viewers,
            question.source,
            question.first_seen,
            time.monotonic(),
        )
        self.records.append(record)
        aired = self._aired[question.id] = asyncio.Event()
        caption = draw_caption(question.attribution(), self.width, self.height)
        log.info("question %d: %s", question.id, question.attribution())
        # the answer is thought about while the anchor names the question: its events are
        # read from now on, and queued after the attribution
        call = self.anchor.answer(question.text)
        events: asyncio.Queue = asyncio.Queue()
        listening = asyncio.create_task(_listen(call, events))
        first: Segment | None = None
        try:
            speech = await self.anchor.say(question.attribution())
            record.said = time.monotonic()
            first = self._queue(
                question.id,
                "attribution",
                speech,
                caption,
                smile=SMILE,
                text=question.attribution(),
            )
        except Exception as error:  # the answer still goes on air, with its caption
            log.warning("question %d: attribution failed: %r", question.id, error)
        try:
            while (event := await events.get()) is not None:
                if isinstance(event, TurnError):
                    record.error = f"{event.code}: {event}"
                    log.warning("question %d: %s", question.id, record.error)
                elif isinstance(event, SentenceEvent) and event.audio.size:
                    if not record.sentences:
                        record.first_sentence = time.monotonic()
                    record.sentences += 1
                    speech = Speech(event.audio, event.sample_rate, event.blendshapes, event.fps)
                    segment = self._queue(
                        question.id, "answer", speech, None if first else caption, text=event.text
                    )
                    first = first or segment
                elif isinstance(event, FinalEvent):
                    record.reply = event.reply
                    self.anchor.remember(event.session_id)
        finally:
            listening.cancel()
            call.cancel()
            # the end of the answer: a segment of no frames that the renderer passes when
            # the answer's last word has been handed on (the caption comes down after it)
            end = np.zeros((0, 52), np.float32)
            self.programme.add(Segment(question.id, "end", np.zeros(0, np.float32), end))
        await aired.wait()
        return record

    def _queue(
        self,
        question_id: int,
        kind: str,
        speech: Speech,
        caption: Caption | None,
        *,
        smile: float = 0.0,
        text: str = "",
    ) -> Segment:
        audio, shapes = stream_speech(
            speech.audio,
            speech.sample_rate,
            speech.blendshapes,
            speech.fps,
            stream_fps=self.fps,
            stream_rate=self.sample_rate,
        )
        if smile:
            shapes = with_smile(Pose(shapes, np.zeros((len(shapes), 3))), smile).blendshapes
        # the first segment of each kind of a question names its first tick in the output
        mark = None
        if (question_id, kind) not in self._marked:
            self._marked.add((question_id, kind))
            mark = mark_of(question_id, kind)
        segment = Segment(question_id, kind, audio, shapes, caption, text, mark)
        self.programme.add(segment)
        return segment

    # the renderer: ticks out
    async def render(self) -> None:
        """Render and hand on ticks forever (until cancelled); the output's queue paces it.
        The output's clock starts once the renderer is warm (its first requests of a batch
        size are slow) and the first ticks wait in its queue."""
        for _ in range(WARM_UP_BATCHES):
            life = self.life.frames(0, RENDER_TICKS)
            await self.anchor.render(life.blendshapes, life.head_pose)
        while self.tick < self.prefill_ticks:
            await self.render_ticks(RENDER_TICKS)
        self.output.start()
        self._on_air = True
        underflows = 0
        while True:
            try:
                await self.render_ticks(RENDER_TICKS)
            except (asyncio.CancelledError, OutputError):
                raise
            except Exception as error:  # Triton restarting a model: the stream goes on
                # (the output repeats its last frame) and the render is tried again
                log.warning("render failed at tick %d: %r; retrying", self.tick, error)
                await asyncio.sleep(RENDER_RETRY_S)
            now = self.output.underflows
            if now > underflows:  # the air got ahead of the renderer: frames were repeated
                log.warning(
                    "output underflow: %d ticks repeated before tick %d (render %.0f ms for %d)",
                    now - underflows,
                    self.tick,
                    self.render_s[-1] * 1000,
                    RENDER_TICKS,
                )
                underflows = now

    async def render_ticks(self, count: int) -> None:
        first = self.tick
        take = self.programme.take(count)
        pose = self.blend.mix(self.life.frames(first, count), take.blendshapes, take.speaking)
        started = time.monotonic()
        rows = self._rows_to_draw(count)
        if len(rows) < count:
            drawn = await self.anchor.render(pose.blendshapes[rows], pose.head_pose[rows])
            frames = between_frames(drawn, rows, count, before=self._last_drawn)
            self.thinned_batches += 1
            self.sparse_batches += len(rows) == 1
        else:
            frames = await self.anchor.render(pose.blendshapes, pose.head_pose)
        self._last_drawn = frames[-1]
        self.render_s.append(time.monotonic() - started)
        frames = fit_frames(frames, self.width, self.height)
        captions = self._captions(first, count, take)
        marks = {offset: s.mark for offset, s in take.started if s.mark}
        for offset, (rendered, caption) in enumerate(zip(frames, captions, strict=True)):
            frame = caption.over(rendered) if caption is not None else rendered
            await self.output.put_async(frame, take.audio[offset], marks.get(offset))
        self.tick += count
        self._note_aired(first, take, time.monotonic())

    def _rows_to_draw(self, count: int) -> list[int]:
        """Which of the next `count` ticks the renderer draws; the others are blended from
        their drawn neighbours (`between_frames`). Behind the air (the CPU busy with an
        answer's LLM and voice) every other tick, and far behind only the last, bridged from
        the previous batch's last frame: a fifth of the render cost, so the queue refills
        even on a CPU where the renderer gets a third of a core (an underflow repeats a
        frame with silence, a gap in the anchor's speech)."""
        queued = self.output.queued
        if queued >= self.low_water_ticks or not self._on_air:
            return list(range(count))
        if queued < self.low_water_ticks // 2 and self._last_drawn is not None:
            return [count - 1]
        return sorted({*range(0, count, 2), count - 1})

    def _captions(self, first: int, count: int, take) -> list[Caption | None]:
        starts = {offset: segment for offset, segment in take.started}
        out: list[Caption | None] = []
        for offset in range(count):
            segment = starts.get(offset)
            if segment is not None and segment.caption is not None:
                self._caption, self._caption_until = segment.caption, None
            if self._caption_until is not None and first + offset >= self._caption_until:
                self._caption = self._caption_until = None
            out.append(self._caption)
        for offset, segment in take.ended:
            if segment.kind == "end" and self._caption is not None:
                self._caption_until = first + offset + round(CAPTION_HOLD_S * self.fps)
        return out

    def _note_aired(self, first: int, take, handed: float) -> None:
        for offset, segment in take.started:
            record = self._record(segment.question_id)
            if record is None:
                continue
            if segment.kind == "attribution" and record.attribution_tick is None:
                record.attribution_tick = first + offset
            if segment.kind == "answer" and record.answer_tick is None:
                record.answer_tick, record.answer_rendered = first + offset, handed
        for offset, segment in take.ended:
            if segment.kind == "end":
                record = self._record(segment.question_id)
                if record is not None:
                    record.end_tick = first + offset
                aired = self._aired.pop(segment.question_id, None)
                if aired is not None:
                    aired.set()

    def _record(self, question_id: int) -> QuestionRecord | None:
        return next((r for r in reversed(self.records) if r.id == question_id), None)

    async def run(self) -> None:
        """Host and render until cancelled (or one of them fails)."""
        tasks = [asyncio.create_task(self.render()), asyncio.create_task(self.host())]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            for task in done:
                task.result()
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    def stats(self) -> dict[str, Any]:
        render = np.asarray(list(self.render_s)[-250:] or [0.0])
        return {
            "ticks": self.tick,
            "media_s": round(self.tick / self.fps, 2),
            "questions": len(self.records),
            "answering": bool(self._aired),
            "queued_speech_s": round(self.programme.queued_frames() / self.fps, 2),
            "thinned_batches": self.thinned_batches,
            "sparse_batches": self.sparse_batches,
            "render_ms_per_frame_p50": round(float(np.median(render)) * 1000 / RENDER_TICKS, 1),
        }


async def _listen(call: TurnCall, into: asyncio.Queue) -> None:
    """A turn's events into `into`, then its TurnError if it failed, then None."""
    try:
        async for event in call.events(idle_timeout_s=ANSWER_IDLE_TIMEOUT_S):
            await into.put(event)
    except TurnError as error:
        await into.put(error)
    finally:
        into.put_nowait(None)


def mark_of(question_id: int, kind: str) -> str:
    """The output's mark on the first tick of a question's segment of `kind`
    (broadcast.output.PacedOutput.mark_times)."""
    return f"question-{question_id}-{kind}"


def between_frames(
    drawn: np.ndarray, rows: list[int], count: int, before: np.ndarray | None = None
) -> np.ndarray:
    """`count` frames from `drawn` [len(rows), H, W, 3] at the sorted offsets `rows` (the
    last among them): a missing frame is drawn between its drawn neighbours, weighted by how
    near it is to each; `before` is the frame at offset -1 (the previous batch's last), which
    the frames ahead of the first row are drawn from (without it the first row must be 0)."""
    if before is not None:
        drawn, rows = np.concatenate([before[None], drawn]), [-1, *rows]
    elif rows[0] != 0:
        raise ValueError(f"rows {rows} start after offset 0 with no frame before them")
    frames = np.empty((count + 1, *drawn.shape[1:]), np.uint8)  # index -1: `before`
    frames[rows] = drawn
    for start, end in itertools.pairwise(rows):
        # integers in uint16 (at most 255 * span): 0.6 ms a 512 x 512 frame, where uint32
        # took 17 ms and was half the show's own CPU on a 2-core machine
        a, b = frames[start].astype(np.uint16), frames[end].astype(np.uint16)
        span = end - start
        for i in range(start + 1, end):
            w = end - i  # the weight of the frame before, out of `span`
            mixed = a * np.uint16(w)
            mixed += b * np.uint16(span - w)
            mixed += np.uint16(span // 2)  # rounded to the nearest
            frames[i] = mixed // np.uint16(span)
    return frames[:count]


def fit_frames(frames: np.ndarray, width: int, height: int) -> np.ndarray:
    """Frames [T, h, w, 3] at the stream's size (the cartoon renders 256 x 256)."""
    _, h, w, _ = frames.shape
    if (h, w) == (height, width):
        return frames
    if height % h == 0 and width % w == 0 and height // h == width // w:
        k = height // h
        return frames.repeat(k, axis=1).repeat(k, axis=2)
    from PIL import Image

    return np.stack(
        [np.asarray(Image.fromarray(f).resize((width, height), Image.BILINEAR)) for f in frames]
    )
