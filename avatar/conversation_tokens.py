"""Conversation tokens: the server makes conversation ids and binds each to whoever holds
its token. (The live protocol calls them `session_id` / `session_token`, as the `avatar`
model's inputs do; a WebSocket is a connection, gateway/connection.py; the load balancer's
`session-id` header is the affinity key, `affinity_headers`.)

A token is `s1.<id>.<mac>`: a random 128-bit id and an HMAC-SHA256 of it under the
operator's session secret, so any process that holds the secret (every Triton replica,
every gateway) verifies a token without shared state, and nobody without the secret can
name a session it was not given. The id alone (not secret) is what the conversation store
keys and the load balancer hashes (the `session-id` header); the token is a bearer
credential and is never logged.

The secret comes from the environment: AVATAR_SESSION_SECRET, or a file named by
AVATAR_SESSION_SECRET_FILE (a Kubernetes Secret mounted as a file). A server with neither
trusts the session ids its callers choose (the embedded server's tests; `avatar serve`
and the deployments always set one).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets
from collections.abc import Mapping

from avatar.credentials import read_secret
from avatar.errors import RequestError, check_session_id

SECRET_ENV = "AVATAR_SESSION_SECRET"
SECRET_FILE_ENV = f"{SECRET_ENV}_FILE"  # read_secret's convention
NEW_SESSION = "new"  # a session_id that asks the server for a new session (and its token)
AFFINITY_HEADER = "session-id"  # what the load balancer hashes (deploy/haproxy)
MIN_SECRET_BYTES = 16
_PREFIX = "s1"
_TOKEN = re.compile(r"^s1\.([0-9a-f]{32})\.([A-Za-z0-9_-]{32})$")


class ConversationTokens:
    """Mints and verifies the session tokens of one secret."""

    def __init__(self, secret: bytes | str) -> None:
        key = secret.encode() if isinstance(secret, str) else bytes(secret)
        if len(key) < MIN_SECRET_BYTES:
            raise ValueError(
                f"the session secret has {len(key)} bytes: expected at least {MIN_SECRET_BYTES}"
            )
        self._key = key

    @classmethod
    def from_environment(cls, env: Mapping[str, str] | None = None) -> ConversationTokens | None:
        """The tokens of $AVATAR_SESSION_SECRET or the file $AVATAR_SESSION_SECRET_FILE
        names; None when neither is set."""
        secret = read_secret(SECRET_ENV, env)
        return cls(secret) if secret else None

    def _mac(self, session_id: str) -> str:
        digest = hmac.new(self._key, f"{_PREFIX}.{session_id}".encode(), hashlib.sha256)
        return base64.urlsafe_b64encode(digest.digest()[:24]).decode()

    def mint(self) -> str:
        """A new session's token."""
        session_id = secrets.token_hex(16)
        return f"{_PREFIX}.{session_id}.{self._mac(session_id)}"

    def verify(self, token: str, what: str = "session_id") -> str:
        """The session id that `token` holds; RequestError when it is not a token this
        secret made (the message never repeats the token)."""
        match = _TOKEN.match(token.strip()) if isinstance(token, str) else None
        if match is None:
            raise RequestError(
                f"{what} is not a session token: expected the token the server returned "
                f"for the session (s1.<id>.<mac>), or {NEW_SESSION!r} for a new session"
            )
        session_id, mac = match.groups()
        if not hmac.compare_digest(mac, self._mac(session_id)):
            raise RequestError(f"{what} is not a session this server made (its signature is wrong)")
        return session_id


def session_of(token: str) -> str:
    """The id part of a well-formed token (unverified: for routing and logs), else ""."""
    match = _TOKEN.match(token.strip()) if isinstance(token, str) else None
    return match.group(1) if match else ""


def affinity_headers(session: str) -> dict[str, str]:
    """The `session-id` header that the load balancer (deploy/haproxy) hashes, so that every
    call of a session reaches the replica whose KV cache holds it: a token's id (never the
    token, a credential), or a trusted caller's own printable id; none for "" or "new"."""
    routed = session_of(session)
    if not routed and session != NEW_SESSION and session.isascii() and session.isprintable():
        routed = session
    return {AFFINITY_HEADER: routed} if routed else {}


def resolve(
    tokens: ConversationTokens | None,
    value: str,
    what: str = "session_id",
    *,
    allow_new: bool = True,
) -> tuple[str, str]:
    """A `session_id`-like input -> (the token its holder keeps using, the id its memory is
    kept under); ("", "") for none. `NEW_SESSION` makes a session (when `allow_new`).
    Without `tokens` (no secret configured) the callers' own ids are trusted as they are."""
    value = value.strip() if isinstance(value, str) else ""
    if not value:
        return "", ""
    if value == NEW_SESSION and allow_new:
        if tokens is None:
            fresh = secrets.token_hex(16)
            return fresh, fresh
        token = tokens.mint()
        return token, session_of(token)
    if tokens is None:
        value = check_session_id(value, what)
        return value, value
    return value, tokens.verify(value, what)
