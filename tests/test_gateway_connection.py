"""One live connection (gateway/connection.py) wired to a fake Triton client and a recording
socket, driven through the protocol's own messages: microphone audio, text, controls.
No server: the speech probabilities are scripted per 32-ms chunk."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest
from test_gateway_turns import TOKENS, FakeTriton, Socket, final, sentence

from avatar import live_protocol
from avatar.vad import CHUNK, CHUNK_S
from gateway.connection import Connection
from gateway.hearing import PassBudget
from gateway.options import SessionOptions

QUIET = SessionOptions(partial_every_s=None)  # no passes while speaking unless a test wants


def _session(
    triton: FakeTriton, socket: Socket, options=QUIET, budget=None, trusted=False
) -> Connection:
    budget = budget or PassBudget(options.partial_limit, options.pause_first)
    return Connection(
        triton,
        socket.send_json,
        socket.send_bytes,
        options,
        budget=budget,
        tokens=TOKENS,
        trusted=trusted,
    )


async def _mic(session: Connection, chunks: int) -> None:
    """`chunks` of microphone audio in 4-chunk messages, as a page sends them."""
    for start in range(0, chunks, 4):
        count = min(4, chunks - start)
        await session.on_binary(live_protocol.mic_message(np.zeros(count * CHUNK, np.float32)))
        await asyncio.sleep(0)


def _of(socket: Socket, kind: str) -> list[dict]:
    return [m for m in socket.sent if isinstance(m, dict) and m["type"] == kind]


def test_a_spoken_question_starts_from_the_transcript_at_its_pause() -> None:
    """Speech, then silence: the pause's pass (0.1 s) is shown and, once the end is
    confirmed (0.7 s), the turn starts from its text."""
    speech, silence = 40, round(0.7 / CHUNK_S)

    async def scenario():
        probs = [0.0] * 10 + [0.9] * speech + [0.0] * silence
        triton, socket = FakeTriton(probs=probs), Socket()
        session = _session(triton, socket)
        await session.hello()
        await _mic(session, len(probs))
        await session.turns.current.task
        await session.close()
        return triton, socket, session

    triton, socket, session = asyncio.run(scenario())
    assert socket.types()[:5] == [
        "ready", "speech_start", "partial_transcript", "speech_end", "turn_start",
    ]  # fmt: skip
    ready, _, caption, end, start = socket.sent[:5]
    assert ready["session_token"] == session.session_id and ready["end_silence_s"] == 0.7
    assert ready["session_id"] == TOKENS.verify(session.session_id)
    assert ready["frames"]["width"] == 55 and len(ready["frames"]["names"]) == 55
    assert caption["at_pause"] and caption["text"] == "Hello there."
    # pre-roll (9 chunks), the speech, and the silence that ended it
    assert end["utterance_s"] == round((9 + speech + silence) * CHUNK / 16000, 3)
    assert start["speculative_asr"] and start["input"] == "audio"
    assert triton.turns[0]["text"] == "Hello there." and triton.turns[0]["audio"] is None
    assert socket.types()[-1] == "turn_end"


def test_without_speculation_the_avatar_hears_the_audio() -> None:
    options = SessionOptions(speculate_after_s=None, partial_every_s=None)

    async def scenario():
        triton, socket = FakeTriton(probs=[0.9] * 20 + [0.0] * 30), Socket()
        session = _session(triton, socket, options)
        await _mic(session, 50)  # speech from the first chunk: no pre-roll
        await session.turns.current.task
        return triton, socket

    triton, socket = asyncio.run(scenario())
    assert triton.passes == [] and not _of(socket, "partial_transcript")
    (request,) = triton.turns
    assert request["text"] is None and request["audio"].size == (20 + 22) * CHUNK
    assert _of(socket, "turn_start")[0]["speculative_asr"] is False


def test_a_click_is_too_short_and_starts_no_turn() -> None:
    async def scenario():
        triton, socket = FakeTriton(probs=[0.9] * 3 + [0.0] * 30), Socket()
        await _mic(_session(triton, socket), 33)
        return triton, socket

    triton, socket = asyncio.run(scenario())
    # the pause's pass ran (0.2 s), then the end found the speech too short: no turn
    assert socket.types() == ["speech_start", "partial_transcript", "speech_end"]
    assert socket.sent[-1] == {"type": "speech_end", "utterance_s": 0.0} and triton.turns == []


def test_speaking_over_the_reply_interrupts_it() -> None:
    async def scenario():
        triton = FakeTriton(probs=[0.0] * 8 + [0.9] * 10, turn_events=[sentence()], hang=True)
        socket = Socket()
        session = _session(triton, socket)
        await session.on_text(json.dumps({"type": "text", "text": " Tell me a story. "}))
        await _mic(session, 18)
        await session.close()
        return triton, socket

    triton, socket = asyncio.run(scenario())
    assert triton.turns[0]["text"] == "Tell me a story."
    kinds = socket.types()
    assert kinds.index("speech_start") < kinds.index("interrupt") < kinds.index("turn_end")
    assert _of(socket, "interrupt") == [{"type": "interrupt", "turn": 1, "reason": "barge-in"}]
    assert _of(socket, "turn_end") == [{"type": "turn_end", "turn": 1, "cancelled": "barge-in"}]


def test_a_speculative_turn_is_held_then_confirmed_and_the_conversation_forks() -> None:
    options = SessionOptions(partial_every_s=None, speculate_turn=True)

    async def scenario():
        triton = FakeTriton(probs=[0.9] * 30 + [0.0] * 22, turn_events=[sentence(), final()])
        socket = Socket()
        session = _session(triton, socket, options)
        first = session.session_id
        await _mic(session, 52)
        await session.turns.current.task
        return triton, socket, session, first

    triton, socket, session, first = asyncio.run(scenario())
    kinds = socket.types()
    assert kinds[: kinds.index("speech_end") + 2] == [
        "speech_start", "partial_transcript", "speech_end", "turn_start",
    ]  # fmt: skip
    (request,) = triton.turns
    assert request["parent_session_id"] == first and session.session_id == request["session_id"]
    assert _of(socket, "turn_start")[0]["speculative_turn"] is True


def test_controls_are_checked_merged_and_end_silence_ends_utterances_sooner() -> None:
    async def scenario():
        triton, socket = FakeTriton(probs=[0.9] * 20 + [0.0] * 13), Socket()
        session = _session(triton, socket, SessionOptions(speculate_after_s=None))
        await session.set_controls({"end_silence_s": 0.4, "fps": 25, "render": True})
        await session.set_controls({"emotion": "happy"})
        for bad in ("soon", True, 0.05, 5):
            with pytest.raises(live_protocol.ProtocolError, match="end_silence_s"):
                await session.set_controls({"end_silence_s": bad})
        with pytest.raises(live_protocol.ProtocolError, match="fps"):
            await session.set_controls({"fps": "fast"})
        await _mic(session, 33)  # 13 silent chunks: 0.42 s
        await session.turns.current.task
        return triton, socket, session

    triton, socket, session = asyncio.run(scenario())
    assert _of(socket, "controls") == [
        {"type": "controls", "controls": {"fps": 25, "end_silence_s": 0.4}},
        {"type": "controls", "controls": {"fps": 25, "emotion": "happy", "end_silence_s": 0.4}},
    ]
    assert session.options.end_silence_s == 0.4 and len(_of(socket, "speech_end")) == 1
    assert triton.turns[0]["controls"] == {"fps": 25, "emotion": "happy"}


@pytest.mark.parametrize(
    ("message", "needle"),
    [
        ("not json", "not JSON"),
        ("[1]", "JSON object"),
        ('{"type": "dance"}', "unknown message type 'dance'"),
        ('{"type": "text", "text": " "}', "non-empty"),
        ('{"type": "text", "text": "' + "a" * 2001 + '"}', "at most 2000"),
        ('{"type": "controls", "controls": 3}', "object field"),
    ],
)
def test_bad_messages_are_refused_with_what_was_expected(message: str, needle: str) -> None:
    async def scenario():
        with pytest.raises(live_protocol.ProtocolError, match=needle):
            await _session(FakeTriton(), Socket()).on_text(message)

    asyncio.run(scenario())


def test_ping_and_interrupt() -> None:
    async def scenario():
        triton, socket = FakeTriton(turn_events=[sentence()], hang=True), Socket()
        session = _session(triton, socket)
        await session.on_text('{"type": "ping", "t": 7}')
        await session.on_text('{"type": "text", "text": "Hi"}')
        await asyncio.sleep(0.01)
        await session.on_text('{"type": "interrupt"}')
        return socket

    socket = asyncio.run(scenario())
    assert socket.sent[0] == {"type": "pong", "t": 7}
    assert _of(socket, "interrupt") == [{"type": "interrupt", "turn": 1, "reason": "client"}]


def test_the_command_line_defaults_are_the_session_options() -> None:
    from gateway.__main__ import command_line, session_options

    assert session_options(command_line().parse_args([])) == SessionOptions()
    args = command_line().parse_args(["--no-speculate", "--speculate-turn", "--end-silence-s", "1"])
    off = session_options(args)
    assert off.speculate_after_s is None and off.partial_every_s is None
    assert not off.speculate_turn and off.end_silence_s == 1.0


def test_every_flag_of_the_sessions_is_a_session_option_and_is_forwarded() -> None:
    """The gateway's session flags are generated from SessionOptions (gateway/flags.py): each
    one sets its field, and `avatar serve --web` forwards what differs from the default."""
    import argparse
    import dataclasses

    from gateway.flags import add_gateway_arguments, forwarded, session_flags, session_options

    parser = argparse.ArgumentParser()
    actions = add_gateway_arguments(parser)
    named = {a.dest for a in actions}
    assert {f.name for f in session_flags()} <= named
    argv = ["--passes-alongside", "--partials-max-answering", "2", "--no-partials",
            "--endpointing", "silence", "--allow-persona-text",
            "--detect-language-s", "3"]  # fmt: skip
    args = parser.parse_args(argv)
    options = session_options(args)
    assert not options.pause_first and options.partial_max_answering == 2
    assert options.partial_every_s is None and options.endpointing == "silence"
    assert options.allow_persona_text and options.detect_language_s == 3.0
    changed = {f.name for f in dataclasses.fields(SessionOptions)} - {
        f.name for f in dataclasses.fields(SessionOptions)
        if getattr(options, f.name) == getattr(SessionOptions(), f.name)
    }  # fmt: skip
    assert changed == {"pause_first", "partial_max_answering", "partial_every_s", "endpointing",
                       "allow_persona_text", "detect_language_s"}  # fmt: skip
    assert sorted(forwarded(args, actions)) == sorted(
        ["--passes-alongside", "--partials-max-answering", "2", "--no-partials",
         "--endpointing", "silence", "--allow-persona-text", "--detect-language-s", "3.0"]
    )  # fmt: skip
    with pytest.raises(SystemExit):
        parser.parse_args(["--endpointing", "psychic"])


class _LateAnswers(FakeTriton):
    """The end-of-turn models answer only once `answer` is set: the audio finished, the
    words not."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.answer = asyncio.Event()

    async def turn_complete(self, audio, *, session: str = "") -> float:
        await self.answer.wait()
        return 0.99

    async def words_finished(self, text: str, *, session: str = "") -> float:
        return 0.05


def test_the_turn_waits_for_a_late_answer_and_its_unfinished_words_hold_the_pause() -> None:
    speech, late, more = 40, round(0.9 / CHUNK_S), round(1.0 / CHUNK_S)

    async def scenario():
        probs = [0.0] * 10 + [0.9] * speech + [0.0] * (late + more)
        triton, socket = _LateAnswers(probs=probs, text="Can you tell me."), Socket()
        session = _session(triton, socket)
        await _mic(session, 10 + speech + late)  # 0.9 s of silence: past the 0.7-s rule
        waited = "speech_end" not in socket.types()
        triton.answer.set()
        await asyncio.sleep(0.05)
        held = "speech_end" not in socket.types()  # "can you tell me": 1.8 s
        await _mic(session, more)
        await session.close()
        return waited, held, socket

    waited, held, socket = asyncio.run(scenario())
    assert waited and held
    assert [m["ended_by"] for m in _of(socket, "speech_end")] == ["silence"]
