"""Session tokens (server-made ids bound to their holder) and the conversation stores: the
in-process one and Redis (a real redis-server, started here), shared by two engines as two
replicas share it; a Redis that dies mid-conversation costs that memory, not the turn."""

from __future__ import annotations

import contextlib
import time

import pytest

from avatar.conversation_tokens import (
    NEW_SESSION,
    ConversationTokens,
    affinity_headers,
    resolve,
    session_of,
)
from avatar.errors import RequestError
from avatar.llm.conversation import MemoryStore, RedisStore, StoreError, open_store
from avatar.llm.template import Message

SECRET = "a-session-secret-for-tests-0123456789"


def conversation(*turns: str) -> list[Message]:
    messages = [Message("system", "persona")]
    for text in turns:
        messages += [Message("user", text), Message("assistant", f"re: {text}")]
    return messages


# ---------------------------------------------------------------------------- tokens


def test_a_token_names_its_session_and_only_its_secret_made_it():
    tokens = ConversationTokens(SECRET)
    token = tokens.mint()
    assert tokens.verify(token) == session_of(token) and len(session_of(token)) == 32
    assert tokens.mint() != token
    other = ConversationTokens("another-secret-of-enough-length")
    with pytest.raises(RequestError, match="signature is wrong") as error:
        other.verify(token)
    assert token not in str(error.value)  # a bearer credential is never echoed
    prefix, session_id, mac = token.split(".")
    forged = f"{prefix}.{'0' * 32}.{mac}"  # someone else's id under this token's signature
    with pytest.raises(RequestError, match="signature is wrong"):
        tokens.verify(forged)
    for bad in ("chat", "", "s1.abc.def", token + "x", session_id):
        with pytest.raises(RequestError, match="not a session token"):
            tokens.verify(bad)


def test_resolve_makes_new_sessions_and_trusts_ids_only_without_a_secret():
    tokens = ConversationTokens(SECRET)
    assert resolve(tokens, "") == ("", "")
    token, session_id = resolve(tokens, NEW_SESSION)
    assert tokens.verify(token) == session_id
    assert resolve(tokens, token) == (token, session_id)
    with pytest.raises(RequestError, match="parent_session_id is not a session token"):
        resolve(tokens, NEW_SESSION, "parent_session_id", allow_new=False)
    with pytest.raises(RequestError):
        resolve(tokens, "victim-session")  # a chosen id is refused when a secret is set
    assert resolve(None, "chat") == ("chat", "chat")  # no secret: the caller's id, as sent
    fresh, same = resolve(None, NEW_SESSION)
    assert fresh == same and len(fresh) == 32


def test_the_secret_comes_from_the_environment_or_a_file(tmp_path):
    assert ConversationTokens.from_environment({}) is None
    token = ConversationTokens(SECRET).mint()
    assert ConversationTokens.from_environment({"AVATAR_SESSION_SECRET": SECRET}).verify(token)
    path = tmp_path / "secret"
    path.write_text(SECRET + "\n")
    from_file = ConversationTokens.from_environment({"AVATAR_SESSION_SECRET_FILE": str(path)})
    assert from_file.verify(token)
    with pytest.raises(ValueError, match="at least 16"):
        ConversationTokens("short")
    with pytest.raises(ValueError, match="AVATAR_SESSION_SECRET_FILE"):
        ConversationTokens.from_environment({"AVATAR_SESSION_SECRET_FILE": str(tmp_path / "none")})


# ---------------------------------------------------------------------------- memory


def test_memory_store_forgets_idle_conversations():
    store = MemoryStore(capacity=10, ttl_s=0.2)
    store.save("a", conversation("hi"))
    assert store.history("a") == conversation("hi")
    time.sleep(0.3)
    assert store.history("a") == []
    store.save("b", conversation("hi"))
    assert len(store) == 1


def test_one_turn_strangers_cannot_evict_real_conversations():
    """256 cheap sessions used to push every real conversation out (least recently used
    eviction): now a full store evicts the one-exchange conversations first."""
    store = MemoryStore(capacity=8)
    store.save("alice", conversation("My name is Alice.", "My code is 4417."))
    store.save("bob", conversation("I am Bob.", "I like tea."))
    for i in range(256):
        store.save(f"stranger-{i}", conversation("hello"))
    assert store.history("alice") == conversation("My name is Alice.", "My code is 4417.")
    assert store.history("bob") and len(store) == 8
    assert store.history("stranger-255")  # the newest stranger was not evicted either


# ---------------------------------------------------------------------------- Redis


def test_redis_store_keeps_each_conversation_whole_with_a_time_to_live(redis_url):
    store = open_store(redis_url, ttl_s=120)
    assert isinstance(store, RedisStore)
    store.save("a", conversation("Zebulon here.", "Mon code est 4417 — ünïcode."))
    store.save("b", conversation("other"))
    assert RedisStore(redis_url).history("a") == conversation(
        "Zebulon here.", "Mon code est 4417 — ünïcode."
    )  # another replica's store reads what this one wrote
    assert store.history("b") == conversation("other") and store.history("c") == []
    ttl = store.client.command("TTL", RedisStore.KEY + "a")
    assert 100 < ttl <= 120


def test_a_dead_redis_costs_a_bounded_wait_then_none(redis_url):
    store = RedisStore(redis_url, timeout_s=0.3, retry_after_s=5.0)
    store.save("a", conversation("hi"))
    with contextlib.suppress(OSError):  # it closes the connection instead of answering
        RedisStore(redis_url).client.command("SHUTDOWN", "NOSAVE")
    started = time.monotonic()
    with pytest.raises(StoreError, match="read failed"):
        store.history("a")
    with pytest.raises(StoreError, match="skipped"):
        store.save("a", conversation("hi", "again"))  # no second wait while it is down
    assert time.monotonic() - started < 2.0 and store.failures == 1


def test_open_store_refuses_what_is_not_a_store_url():
    assert isinstance(open_store(""), MemoryStore)
    for url in ("http://127.0.0.1:6379", "rediss://127.0.0.1:6379", "redis://"):
        with pytest.raises(ValueError, match="expected redis://"):
            open_store(url)


def test_a_password_and_a_database_from_the_url(redis_url):
    """AUTH and SELECT from redis://:PASSWORD@HOST:PORT/DB; a wrong password is a
    StoreError that names no secret."""
    admin = RedisStore(redis_url).client
    admin.command("CONFIG", "SET", "requirepass", "pa55word")
    base = redis_url.replace("redis://", "redis://:pa55word@").rsplit("/", 1)[0]
    store = RedisStore(base + "/3")
    store.save("a", conversation("hi"))
    assert store.history("a") == conversation("hi")
    assert RedisStore(base + "/0").history("a") == []  # another database
    wrong = RedisStore(base.replace("pa55word", "guess") + "/3")
    with pytest.raises(StoreError) as error:
        wrong.history("a")
    assert "guess" not in str(error.value) and "pa55word" not in str(error.value)


def test_the_affinity_header_carries_the_id_never_the_token():
    token = ConversationTokens(SECRET).mint()
    assert affinity_headers(token) == {"session-id": session_of(token)}
    assert affinity_headers("chat") == {"session-id": "chat"}  # a trusted caller's own id
    assert affinity_headers("") == affinity_headers(NEW_SESSION) == {}
    assert affinity_headers("ünï") == {}  # gRPC metadata is printable ASCII
