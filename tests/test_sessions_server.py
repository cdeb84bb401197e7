"""Sessions that belong to their holder, on a real embedded tritonserver with a session
secret (as `avatar serve` and the deployments run it): the probe of the security issue,
where a stranger over gRPC forked another user's session by its id and read back the
victim's name and secret code, is refused; the holder's conversation goes on."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from avatar.conversation_tokens import NEW_SESSION, ConversationTokens, session_of
from clients.avatar_stream import stream_turn
from serving.deployment import build_repository
from serving.server import EmbeddedServer, ServerOptions

pytestmark = pytest.mark.server
SECRET = "a-session-secret-for-tests-0123456789"
MODELS = ("avatar", "llm", "llm_decoder", "tts", "tts_vits", "lipsync", "emotion_encoder", "asr",
          "asr_encoder", "asr_decoder")  # fmt: skip
CONTROLS = {"max_tokens": 24, "seed": 3}


@pytest.fixture(scope="module")
def grpc_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    repository = Path(tmp_path_factory.mktemp("signed")) / "repository"
    build_repository(repository, "embedded", MODELS)
    with EmbeddedServer(ServerOptions(repository, session_secret=SECRET)) as server:
        yield server.grpc_url


def test_a_stranger_cannot_name_fork_or_plant_into_another_session(grpc_url):
    victim = stream_turn(
        grpc_url,
        text="My name is Zebulon and my secret code is 4417.",
        session_id=NEW_SESSION,
        controls=CONTROLS,
    )
    assert not victim.error, victim.error
    token = victim.session_id
    assert ConversationTokens(SECRET).verify(token) == session_of(token)  # the server made it
    forged = f"s1.{session_of(token)}.{'A' * 32}"
    for session_id, parent in (
        (NEW_SESSION, session_of(token)),  # the probe: a fork of the victim by its id
        (NEW_SESSION, forged),
        (session_of(token), ""),  # the victim's id as one's own
        ("chat", ""),  # a chosen id
    ):
        stranger = stream_turn(
            grpc_url,
            text="What is my name and my secret code?",
            session_id=session_id,
            parent_session_id=parent,
            controls=CONTROLS,
        )
        assert "not a session" in stranger.error, (session_id, parent, stranger.error)
        assert token not in stranger.error  # a credential is never echoed
    again = stream_turn(grpc_url, text="What is my name?", session_id=token, controls=CONTROLS)
    assert not again.error and again.session_id == token
    assert again.final["timings"]["llm_stats"]["prompt_tokens"] > 40  # the history was read


@pytest.mark.parametrize("same_secret", [False, True])
def test_a_gateway_with_another_secret_says_so_at_start_and_on_every_turn(
    grpc_url: str, tmp_path: Path, same_secret: bool
) -> None:
    """`python -m gateway` in front of a Triton that signs with another secret: an error in
    its log at start, and each turn ends with `session_rejected`, not a bare turn_failed."""
    import asyncio
    import json
    import time

    import aiohttp

    from gateway.process import running_gateway

    secret = SECRET if same_secret else "another-secret-of-enough-bytes-0123456"
    log = tmp_path / "gateway.log"
    env = {"AVATAR_SESSION_SECRET": secret, "AVATAR_GATEWAY_KEY": ""}
    with running_gateway(grpc_url, ready_path="/", env=env, log_path=log) as (base, _):

        async def turn() -> list[dict]:
            async with (
                aiohttp.ClientSession() as session,
                session.ws_connect(base.replace("http", "ws") + "/ws") as ws,
            ):
                await ws.send_json({"type": "text", "text": "Hello?"})
                got = []
                while not got or got[-1]["type"] != "turn_end":
                    message = await ws.receive(timeout=120)
                    if message.type == aiohttp.WSMsgType.TEXT:
                        got.append(json.loads(message.data))
                return got

        messages = asyncio.run(turn())
        deadline = time.monotonic() + 30
        while "accept" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.2)
    codes = [m["code"] for m in messages if m["type"] == "error"]
    text = log.read_text()
    if same_secret:
        assert codes == [] and "Triton accepts this gateway's sessions" in text
    else:
        assert codes == ["session_rejected"], messages
        assert "Triton does not accept the sessions this gateway signs" in text
