"""The audience's questions (broadcast/chat): text cleaning, the moderated queue on a
simulated clock (honest viewers at a normal pace never refused, a flooding one is;
duplicates merged; blocklist; pin and skip), and the operator's HTTP/WebSocket input on a
real aiohttp server (aiohttp's test server listens on a socket)."""

from __future__ import annotations

import asyncio
import collections
import random
import unicodedata
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import WSMsgType, web
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import given
from hypothesis import strategies as st

from broadcast.chat import text as chat_text
from broadcast.chat.messages import ChatMessage, Question
from broadcast.chat.queue import REASONS, ChatQueue, ModerationRules
from broadcast.chat.web import (
    ERRORS,
    MAX_BODY_BYTES,
    MAX_WS_MESSAGE_BYTES,
    VERDICT_STATUS,
    add_chat_routes,
    chat_routes,
    operator_key_from_environment,
)

KEY = "operator key for the show"
AUTH = {"Authorization": f"Bearer {KEY}"}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _message(viewer: str, text: str, at: float = 0.0, viewer_id: str = "") -> ChatMessage:
    return ChatMessage(viewer, text, "test", at, viewer_id=viewer_id)


# --- text -------------------------------------------------------------------------------


def test_clean_drops_formatting_controls_and_invisible_characters() -> None:
    raw = "\x02Bold\x02 \x0304,12red\x03 \u200bzero\u200dwidth\u202e evil\x00 \x1fline\r\nbreak\t!"
    assert chat_text.clean(raw) == "Bold red zerowidth evil line break !"
    assert chat_text.clean("\x034hello") == "hello"  # a colour without a background
    assert chat_text.clean("Cafe\u0301") == "Café"  # NFC: one character, as captions show it


def test_fold_and_whole_word_phrases() -> None:
    assert chat_text.fold("  Hów OLD are   you?!  ") == "how old are you"
    assert chat_text.contains_phrase(chat_text.fold("a BAD-word here"), "bad word")
    assert not chat_text.contains_phrase(chat_text.fold("classy"), "ass")


@given(st.text(max_size=200))
def test_clean_is_one_visible_line_and_idempotent(raw: str) -> None:
    cleaned = chat_text.clean(raw)
    assert chat_text.clean(cleaned) == cleaned
    assert cleaned == cleaned.strip() and "  " not in cleaned
    assert all(unicodedata.category(ch) not in ("Cc", "Cf", "Cs", "Co") for ch in cleaned)


# --- the queue --------------------------------------------------------------------------


def test_honest_viewers_at_a_normal_pace_are_never_refused_and_a_flooder_is() -> None:
    """10 viewers each ask a question every 2-5 minutes for 30 minutes, a third of them with
    a follow-up 5 s later; the anchor answers one every 8 s; one viewer sends a line a
    second. Every honest question is queued; the flooder gets its burst and then one per
    interval."""
    clock, rng = Clock(), random.Random(7)
    rules = ModerationRules()
    queue = ChatQueue(rules, clock)
    start = clock.now
    next_at = {f"viewer{v}": start + rng.uniform(0, 60) for v in range(10)}
    follow_ups: dict[str, float] = {}
    honest: list[str] = []
    flood: list[str] = []
    for second in range(30 * 60):
        clock.now = start + second
        for viewer, at in next_at.items():
            if min(at, follow_ups.get(viewer, 1e18)) > clock.now:
                continue
            text = f"{viewer} asks about topic{rng.randrange(10**6)} and item{len(honest)}?"
            honest.append(queue.offer(_message(viewer, text, clock.now)).reason)
            if follow_ups.pop(viewer, 1e18) > clock.now:  # a new question, not the follow-up
                next_at[viewer] = clock.now + rng.uniform(120, 300)
                if rng.random() < 0.33:
                    follow_ups[viewer] = clock.now + 5
        flood.append(queue.offer(_message("Spammer", f"buy {second} now", clock.now)).reason)
        if second % 8 == 0 and queue.pending():
            queue.skip(queue.pending()[0].id)  # the anchor's pace, without an event loop
    assert len(honest) > 100 and set(honest) == {"accepted"}, collections.Counter(honest)
    accepted = flood.count("accepted")
    assert accepted <= rules.viewer_burst + 30 * 60 / rules.viewer_interval_s + 1
    assert flood.count("rate_limited") == len(flood) - accepted > 1500
    verdict = queue.offer(_message("Spammer", "one more", clock.now))
    assert verdict.reason == "rate_limited" and "ask again in" in verdict.message


def test_duplicates_merge_into_one_question_with_every_viewer() -> None:
    queue = ChatQueue(ModerationRules(), Clock())
    first = queue.offer(_message("Ada", "How old are you?"))
    assert first.accepted and not first.merged
    for viewer, text in [
        ("Bo", "how   OLD are you!!"),
        ("Cy", "Hów old are you"),
        ("Di", "how old are you really"),  # 4 of 5 words: over the 0.75 overlap
    ]:
        verdict = queue.offer(_message(viewer, text))
        assert (verdict.merged, verdict.question_id) == (True, first.question_id), text
    again = queue.offer(_message("ada", "how old are you"))  # the same viewer: not twice
    assert again.merged
    other = queue.offer(_message("Ed", "how old is your cat"))
    assert other.accepted and not other.merged
    short = queue.offer(_message("Fa", "old you"))  # short texts merge only when equal
    assert not short.merged
    (question, *_rest) = queue.pending()
    assert question.viewers == ("Ada", "Bo", "Cy", "Di")
    assert question.text == "How old are you?"
    assert question.attribution() == "Ada, Bo and 2 others ask: How old are you?"
    assert Question(1, "Why?", ("Ada", "Bo"), "irc", 0.0).attribution() == "Ada and Bo ask: Why?"
    assert Question(1, "Why?", ("Ada",), "irc", 0.0).attribution() == "Ada asks: Why?"


def test_limits_blocklist_and_repeats() -> None:
    clock = Clock()
    rules = ModerationRules(
        max_chars=40,
        max_pending=3,
        blocked_words=("badword", "Naughty Phrase"),
        blocked_viewers=("troll",),
        repeat_window_s=60,
    )
    queue = ChatQueue(rules, clock)

    def reason(viewer: str, text: str, viewer_id: str = "") -> str:
        return queue.offer(_message(viewer, text, clock.now, viewer_id)).reason

    assert reason("Ada", " \x02\u200b\x03 ") == "empty"
    assert reason("Ada", "?!? \U0001f600") == "empty"
    assert reason("\u200b", "a question") == "no_viewer"
    assert reason("Ada", "x" * 41) == "too_long"
    assert reason("Ada", "\u200b" * 500 + "x" * 40) == "accepted"  # the limit is after cleaning
    assert reason("Bo", "is BÁDWORD ok") == "blocked"
    assert reason("Bo", "a naughty,  phrase!") == "blocked"
    assert reason("Bo", "badwords are words") == "accepted"  # whole words only
    assert reason("TheTroll", "hello", viewer_id="Troll") == "blocked"
    assert reason("TROLL", "hello again") == "blocked"
    assert reason("Cy", "what is the weather like") == "accepted"
    assert reason("Di", "one more question here") == "queue_full"
    assert reason("Di", "What is the weather like?") == "merged"  # merging needs no room
    first = queue.pending()[0]
    assert queue.skip(first.id) and not queue.skip(first.id)
    assert reason("Ed", "x" * 40) == "repeated"
    clock.now += 61
    assert reason("Ed", "x" * 40) == "accepted"
    assert set(queue.counts) <= set(REASONS)
    assert queue.removed == {"skipped": 1}


def test_moderators_withdraw_viewers_and_old_questions_expire() -> None:
    clock = Clock()
    queue = ChatQueue(ModerationRules(max_wait_s=300), clock)
    shared = queue.offer(_message("Troll", "why is the sky blue", viewer_id="troll9"))
    queue.offer(_message("Ada", "Why is the sky blue?"))
    queue.offer(_message("Troll", "something rude here", viewer_id="troll9"))
    assert queue.withdraw_viewer("TROLL9") == 2 and queue.withdraw_viewer("nobody") == 0
    (question,) = queue.pending()
    assert (question.id, question.viewers) == (shared.question_id, ("Ada",))
    assert question.attribution() == "Ada asks: why is the sky blue"
    # a withdrawn question is not remembered: someone else may ask it
    assert queue.offer(_message("Bo", "something rude here")).reason == "accepted"
    clock.now += 200
    late = queue.offer(_message("Cy", "a later question for you"))
    queue.pin(shared.question_id)
    clock.now += 150  # Bo's question waited 350 s; the pinned one stays, Cy's is 150 s old
    assert [q.id for q in queue.pending()] == [shared.question_id, late.question_id]
    assert queue.removed == {"withdrawn": 1, "expired": 1}


def test_next_question_waits_and_serves_pinned_first_then_oldest() -> None:
    async def scenario() -> list[int]:
        queue = ChatQueue(ModerationRules())
        waiting = asyncio.create_task(queue.next_question())
        await asyncio.sleep(0.01)
        assert not waiting.done()
        ids = [
            queue.offer(_message(f"v{i}", f"question number {i} here")).question_id
            for i in range(5)
        ]
        assert (await waiting).id == ids[0]
        assert queue.pin(ids[3]) and queue.pin(ids[2]) and not queue.pin(999)
        assert queue.unpin(ids[2]) and queue.pin(ids[4])
        assert queue.skip(ids[1])
        assert [q.id for q in queue.pending()] == [ids[3], ids[4], ids[2]]
        return [(await queue.next_question()).id for _ in range(3)]

    served = asyncio.run(scenario())
    assert served == [4, 5, 3]


# --- the HTTP and WebSocket input ---------------------------------------------------------


def serve(
    scenario: Callable[[TestClient, ChatQueue], Awaitable[Any]],
    key: str | None = KEY,
    rules: ModerationRules | None = None,
) -> Any:
    async def run() -> Any:
        queue = ChatQueue(rules or ModerationRules())
        app = web.Application()
        add_chat_routes(app, queue, key)
        async with TestClient(TestServer(app, host="127.0.0.1")) as client:
            return await scenario(client, queue)

    return asyncio.run(run())


def test_every_verdict_and_error_has_a_status() -> None:
    assert set(VERDICT_STATUS) == set(REASONS)
    assert all(400 <= status < 500 for status, _ in ERRORS.values())
    assert operator_key_from_environment({"AVATAR_GATEWAY_KEY": KEY}) == KEY
    assert operator_key_from_environment({}) is None


def test_without_the_key_nothing_is_served() -> None:
    async def scenario(client: TestClient, queue: ChatQueue) -> None:
        body = {"viewer": "Ada", "text": "hello?"}
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
            response = await client.post("/chat/messages", json=body, headers=headers)
            assert response.status == 401
            assert (await response.json())["error"] == "unauthorized"
            assert response.headers["WWW-Authenticate"].startswith("Bearer")
        assert (await client.get("/chat/queue")).status == 401
        assert (await client.post("/chat/questions/1/skip")).status == 401
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await client.ws_connect("/chat/ws")
        assert refused.value.status == 401
        assert queue.pending() == []

    serve(scenario)


def test_messages_pin_skip_and_bad_bodies_over_http() -> None:
    async def scenario(client: TestClient, queue: ChatQueue) -> None:
        async def post(body: Any, **kwargs: Any) -> tuple[int, dict]:
            response = await client.post("/chat/messages", headers=AUTH, json=body, **kwargs)
            return response.status, await response.json()

        ids = []
        for i, viewer in enumerate(["Ada", "Bo", "Cy"]):
            status, verdict = await post({"viewer": viewer, "text": f"question {i} about things"})
            assert (status, verdict["reason"]) == (202, "accepted")
            ids.append(verdict["question_id"])
        status, verdict = await post({"viewer": "Di", "text": "QUESTION 0 about things!"})
        assert (status, verdict["merged"], verdict["question_id"]) == (202, True, ids[0])
        status, verdict = await post({"viewer": "Ed", "text": "x" * 500})
        assert (status, verdict["reason"]) == (422, "too_long") and "200" in verdict["message"]

        for body in ([1, 2], {"viewer": "Ada"}, {"viewer": 3, "text": "hi"}):
            status, error = await post(body)
            assert (status, error["error"]) == (400, "bad_request"), body
            assert '"viewer"' in error["message"]
        for raw in (b"{not json", b"\xff\xfe", b"[" * 5000):
            response = await client.post("/chat/messages", headers=AUTH, data=raw)
            assert response.status == 400, raw[:10]
        big = {"viewer": "Ada", "text": "y" * MAX_BODY_BYTES}
        status, error = await post(big)
        assert (status, error["error"]) == (413, "body_too_large")

        async def chunks():  # no Content-Length: the limit holds while reading
            for _ in range(4):
                yield b" " * MAX_BODY_BYTES

        response = await client.post("/chat/messages", headers=AUTH, data=chunks())
        assert response.status == 413

        assert (await client.post(f"/chat/questions/{ids[2]}/pin", headers=AUTH)).status == 200
        assert (await client.post(f"/chat/questions/{ids[0]}/skip", headers=AUTH)).status == 200
        missing = await client.post(f"/chat/questions/{ids[0]}/skip", headers=AUTH)
        assert (missing.status, (await missing.json())["error"]) == (404, "unknown_question")
        listed = await (await client.get("/chat/queue", headers=AUTH)).json()
        assert [q["id"] for q in listed["pending"]] == [ids[2], ids[1]]
        assert listed["pending"][0]["pinned"] and listed["pending"][0]["viewers"] == ["Cy"]
        assert listed["pending"][1]["attribution"] == "Bo asks: question 1 about things"
        assert (await queue.next_question()).id == ids[2]

    serve(scenario)


def test_the_websocket_takes_the_same_actions() -> None:
    async def scenario(client: TestClient, queue: ChatQueue) -> None:
        async with client.ws_connect("/chat/ws", headers=AUTH) as ws:

            async def ask(message: Any) -> dict:
                await (
                    ws.send_json(message) if not isinstance(message, str) else ws.send_str(message)
                )
                return await ws.receive_json(timeout=5)

            first = await ask(
                {"action": "message", "viewer": "Ada", "text": "first one?", "ref": 1}
            )
            assert (first["reason"], first["ref"]) == ("accepted", 1)
            second = await ask({"action": "message", "viewer": "Bo", "text": "second one here?"})
            assert second["accepted"] and "ref" not in second
            assert (await ask("{nope"))["error"] == "bad_request"  # still connected after
            assert (await ask("[" * 5000))["error"] == "bad_request"
            assert (await ask({"action": "explode"}))["error"] == "bad_request"
            assert (await ask({"action": "pin", "id": "2"}))["error"] == "bad_request"
            assert (await ask({"action": "message", "viewer": "Cy"}))["error"] == "bad_request"
            await ws.send_bytes(b"\x00")
            assert (await ws.receive_json(timeout=5))["error"] == "bad_request"
            assert (await ask({"action": "pin", "id": second["question_id"]}))["ok"]
            assert (await ask({"action": "skip", "id": 999}))["error"] == "unknown_question"
            listed = await ask({"action": "queue"})
            assert [q["text"] for q in listed["pending"]] == ["second one here?", "first one?"]
            assert listed["counts"] == {"accepted": 2}
            await ws.send_str("x" * (MAX_WS_MESSAGE_BYTES + 1))
            closing = await ws.receive(timeout=5)
            assert closing.type in (WSMsgType.CLOSE, WSMsgType.CLOSED, WSMsgType.CLOSING)
            assert ws.close_code == aiohttp.WSCloseCode.MESSAGE_TOO_BIG
        # the server serves on
        status = (await client.get("/chat/queue", headers=AUTH)).status
        assert status == 200 and len(queue.pending()) == 2

    serve(scenario)


def test_without_a_key_only_local_callers_on_loopback() -> None:
    with pytest.raises(ValueError, match="AVATAR_GATEWAY_KEY"):
        chat_routes(ChatQueue(), None, host="0.0.0.0")
    assert chat_routes(ChatQueue(), None, host="::1")

    async def scenario(client: TestClient, queue: ChatQueue) -> None:
        body = {"viewer": "Ada", "text": "local question"}
        assert (await client.post("/chat/messages", json=body)).status == 202
        local_page = {"Origin": "http://localhost:3000"}
        assert (await client.get("/chat/queue", headers=local_page)).status == 200
        for headers in ({"Origin": "https://evil.example"}, {"Host": "evil.example:8080"}):
            response = await client.post("/chat/messages", json=body, headers=headers)
            assert response.status == 403, headers
            assert (await response.json())["error"] == "forbidden_origin"

    serve(scenario, key=None)
