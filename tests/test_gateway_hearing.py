"""What the gateway hears before a turn (gateway/hearing.py), with a fake `asr`: passes while
speaking and what they agree on, the pass at a pause, its held turn, and the gateway's
budget of passes shared by sessions. No server."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import numpy as np
from test_gateway_turns import FakeTriton, Socket

from avatar.pipeline.priority import AsrPass, current_pass
from avatar.vad import CHUNK, CHUNK_S
from gateway.hearing import Hearing, PassBudget
from gateway.triton_client import Transcript


def _speech(chunks: int) -> np.ndarray:
    return np.zeros(chunks * CHUNK, np.float32)


def _hearing(triton: FakeTriton, budget: PassBudget, socket: Socket, **options) -> Hearing:
    options = {"every_s": 1.0, "detect_language_s": 0.0, **options}
    return Hearing(triton.transcribe, budget, socket.send_json, **options)


def _holder() -> tuple[list[tuple[str, int]], Callable[[str, int], str]]:
    """(what was held, a `hold` that records each (text, prefix tokens) as "turn N")."""
    held: list[tuple[str, int]] = []

    def hold(text: str, prefix_tokens: int) -> str:
        held.append((text, prefix_tokens))
        return f"turn {len(held)}"

    return held, hold


async def _speak(hearing: Hearing, chunks: int) -> None:
    hearing.speaking(chunks * CHUNK_S, lambda: _speech(chunks))
    await asyncio.sleep(0.01)  # the pass runs (the fake answers at once)


def test_a_pass_at_a_pause_cancels_the_passes_while_speaking_and_holds_new_ones() -> None:
    """The pass at a pause decides when the reply can start; the passes while speaking only
    give captions. So once one session pauses, the gateway cancels every pass while
    speaking (any session's: the `asr` model drops a cancelled row at its next step,
    tests/test_asr_triton.py) and starts none until the pause's pass is done;
    `pause_first=False` (--passes-alongside) keeps the old way."""

    async def scenario(pause_first: bool) -> list[dict]:
        triton, socket = FakeTriton(), Socket()
        triton.asr_go.clear()
        budget = PassBudget(limit=1, pause_first=pause_first)
        talking, pausing = (_hearing(triton, budget, socket) for _ in range(2))
        await _speak(talking, 70)  # session 1 is being transcribed while it speaks
        pausing.paused(_speech(70))  # session 2 stops for a moment
        await asyncio.sleep(0.05)
        await _speak(talking, 110)  # a second later session 1 is due another pass
        triton.asr_go.set()
        heard = await pausing.end()
        assert heard is not None and heard.text == "Hello there."
        talking.close()
        pausing.close()
        return triton.passes

    first, pause, *later = asyncio.run(scenario(pause_first=True))
    assert first.get("cancelled") and not pause.get("cancelled") and later == []
    first, pause, *later = asyncio.run(scenario(pause_first=False))
    assert not first.get("cancelled") and not pause.get("cancelled") and later == []


def test_passes_agree_on_a_prefix_that_the_pause_starts_from() -> None:
    async def scenario():
        triton, socket = FakeTriton(), Socket()
        hearing = _hearing(triton, PassBudget(), socket, detect_language_s=2.0)
        await _speak(hearing, 40)  # 1.3 s: not enough to tell the language by
        for chunks in (70, 80, 101, 140):  # 80: less than a second after the last pass
            await _speak(hearing, chunks)
        hearing.paused(_speech(150))
        await asyncio.sleep(0.01)  # its caption goes out before the end is confirmed
        heard = await hearing.end()
        await _speak(hearing, 70)  # the next utterance: its language is known
        return triton.passes, socket.sent, heard

    passes, sent, heard = asyncio.run(scenario())
    assert [round(p["seconds"] / CHUNK_S) for p in passes] == [70, 101, 140, 150, 70]
    # tokens of pass n: [1, 2, 3, n]; two passes agree on [1, 2, 3]
    assert [p["prefix"] for p in passes] == [[], [], [1, 2, 3], [1, 2, 3], []]
    assert [p["language"] for p in passes] == [None, None, None, None, "en"]
    assert heard is not None and (heard.text, heard.prefix_tokens, heard.turn) == (
        "Hello there.",
        3,
        None,
    )
    captions = [(m["at_pause"], m["audio_s"]) for m in sent]
    assert captions == [(False, 2.24), (False, 3.232), (False, 4.48), (True, 4.8), (False, 2.24)]


def test_a_pause_that_was_not_the_end_discards_its_held_turn() -> None:
    async def scenario():
        triton, socket = FakeTriton(), Socket()
        (held, hold), discarded = _holder(), []
        hearing = _hearing(
            triton, PassBudget(), socket, hold=hold, hold_every_pause=True,
            discard=discarded.append,
        )  # fmt: skip
        hearing.paused(_speech(30))
        await asyncio.sleep(0.01)
        hearing.drop()  # the speaker went on
        hearing.paused(_speech(60))
        await asyncio.sleep(0.01)
        return held, discarded, await hearing.end()

    held, discarded, heard = asyncio.run(scenario())
    assert held == [("Hello there.", 0)] * 2 and discarded == ["turn 1"]
    assert heard is not None and heard.turn == "turn 2"


def test_a_held_turn_starts_only_when_asked_at_a_pause_with_a_transcript() -> None:
    """The default (`speculate_held`): no turn at the pause itself; `hold_turn()` (the
    end-of-turn models held the pause) starts one from its transcript, once; none before
    the pass is done; a pause that was not the end discards it."""

    async def scenario():
        triton, socket = FakeTriton(), Socket()
        triton.asr_go.clear()
        (held, hold), discarded = _holder(), []
        hearing = _hearing(triton, PassBudget(), socket, hold=hold, discard=discarded.append)
        hearing.hold_turn()  # no pause yet
        hearing.paused(_speech(30))
        await asyncio.sleep(0.01)
        hearing.hold_turn()  # its pass is still running: no transcript to start from
        triton.asr_go.set()
        await asyncio.sleep(0.01)
        not_asked = list(held)
        hearing.hold_turn()
        hearing.hold_turn()  # asked again in the same pause (the second ask)
        hearing.drop()  # the speaker went on
        hearing.paused(_speech(60))
        await asyncio.sleep(0.01)
        hearing.hold_turn()
        return not_asked, held, discarded, await hearing.end()

    not_asked, held, discarded, heard = asyncio.run(scenario())
    assert not_asked == []
    assert held == [("Hello there.", 0)] * 2 and discarded == ["turn 1"]
    assert heard is not None and heard.turn == "turn 2"


def test_the_end_before_the_pause_pass_is_done_sends_no_caption_after_it() -> None:
    async def scenario():
        triton, socket = FakeTriton(), Socket()
        triton.asr_go.clear()
        hearing = _hearing(triton, PassBudget(), socket)
        hearing.paused(_speech(30))
        await asyncio.sleep(0.01)
        outcome = hearing.end()  # the end of speech is confirmed while the pass runs
        triton.asr_go.set()
        return socket.sent, await outcome

    sent, heard = asyncio.run(scenario())
    assert sent == [] and heard is not None and heard.text == "Hello there."


def test_a_failed_or_empty_pause_pass_leaves_the_turn_to_the_avatar() -> None:
    async def scenario(text: str, fail: bool):
        triton, socket = FakeTriton(text=text), Socket()
        if fail:

            async def broken(audio, prefix=(), language=None):
                raise RuntimeError("asr is down")

            triton.transcribe = broken
        hearing = _hearing(triton, PassBudget(), socket)
        assert await hearing.end() is None  # no pause at all
        hearing.paused(_speech(30))
        return await hearing.end()

    assert asyncio.run(scenario("", fail=False)) is None
    assert asyncio.run(scenario("Hi.", fail=True)) is None
    assert asyncio.run(scenario("Hi.", fail=False)).text == "Hi."


def test_under_load_no_pass_while_speaking_starts() -> None:
    """With `max_answering` 1, captions wait while two replies are being generated."""

    class Replying:
        def __init__(self, generating: bool) -> None:
            self.now = generating

        def generating(self) -> bool:
            return self.now

    budget = PassBudget(limit=1, max_answering=1)
    first, second = Replying(True), Replying(False)
    budget.track(first)
    budget.track(second)
    assert budget.answering() == 1 and budget.has_room()
    second.now = True
    assert budget.answering() == 2 and not budget.has_room()
    budget.untrack(second)
    assert budget.has_room()
    assert PassBudget(limit=1).has_room()  # no limit by default in the class


def test_captions_and_the_pause_pass_say_what_they_are() -> None:
    """Each pass runs in its own task marked with its kind, which the Triton client sends
    as its priority level: captions after the pause's pass (avatar.pipeline.priority)."""
    kinds: list[AsrPass] = []

    async def transcribe(audio, prefix, language) -> Transcript:
        kinds.append(current_pass.get())
        return Transcript("Hello there.", [1, 2], "en")

    async def scenario() -> None:
        hearing = Hearing(
            transcribe, PassBudget(), Socket().send_json, every_s=1.0, detect_language_s=0.0
        )
        await _speak(hearing, 70)
        hearing.paused(_speech(90))
        assert (await hearing.end()).text == "Hello there."
        hearing.close()

    asyncio.run(scenario())
    assert kinds == [AsrPass.CAPTION, AsrPass.PAUSE]
