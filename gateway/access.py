"""Who may use the gateway: services with the operator key, browsers with a short-lived
access token that only an allowed origin can get.

- The operator key (`Authorization: Bearer <key>`) comes from $AVATAR_GATEWAY_KEY or the
  file $AVATAR_GATEWAY_KEY_FILE names: never a flag (`ps` shows argv), never logged, and
  compared in constant time. A connection with it is trusted (it may set free persona text).
- A browser cannot set headers on a WebSocket, so the page first POSTs /access-token: the
  gateway answers only an Origin on the allow-list (browsers always send Origin on a POST
  and a page cannot forge it), with a token that is an HMAC of (origin, expiry), then opens
  /ws offering the token as a subprotocol (`access.<token>`; a query string would land in
  access logs). The token verifies only with the same Origin, for TOKEN_TTL_S.
- Without Origin and without a key (a script, not a browser): admitted only while no
  operator key is configured (the gateway logs that it is open to such clients).

Every gateway replica with the same session secret verifies the others' tokens.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import hmac
import ipaddress
import logging
import secrets
import time
from collections.abc import Callable, Mapping
from urllib.parse import urlsplit

from avatar.conversation_tokens import SECRET_ENV
from avatar.credentials import GATEWAY_KEY_ENV, read_secret
from gateway.protocol import RefusalError

log = logging.getLogger(__name__)
KEY_ENV = GATEWAY_KEY_ENV  # or a file named by AVATAR_GATEWAY_KEY_FILE
TOKEN_TTL_S = 300.0
SUBPROTOCOL = "avatar.v1"  # the subprotocol the gateway answers the page's offer with
TOKEN_PROTOCOL_PREFIX = "access."
LOCAL_HOSTS = ("localhost", "127.0.0.1", "[::1]")
_VERSION = "a1"


class AccessTokens:
    """Browser access tokens `a1.<expiry>.<nonce>.<mac>`, bound to the origin that got one."""

    def __init__(self, key: bytes, clock: Callable[[], float] = time.time) -> None:
        self._key, self._clock = key, clock

    @classmethod
    def from_environment(cls, env: Mapping[str, str] | None = None) -> AccessTokens:
        """Keyed by the session secret, so that every gateway replica verifies the others'
        tokens; without one, a random per-process key (tokens verify on this process)."""
        secret = read_secret(SECRET_ENV, env)  # or the file $AVATAR_SESSION_SECRET_FILE names
        if not secret:
            return cls(secrets.token_bytes(32))
        return cls(hmac.new(secret.encode(), b"gateway access tokens", hashlib.sha256).digest())

    def _mac(self, expiry: int, nonce: str, origin: str) -> str:
        message = f"{_VERSION}.{expiry}.{nonce}.{origin}".encode()
        digest = hmac.new(self._key, message, hashlib.sha256).digest()[:24]
        return base64.urlsafe_b64encode(digest).decode()

    def mint(self, origin: str, ttl_s: float = TOKEN_TTL_S) -> str:
        expiry, nonce = int(self._clock() + ttl_s), secrets.token_hex(8)
        return f"{_VERSION}.{expiry}.{nonce}.{self._mac(expiry, nonce, origin)}"

    def verify(self, token: str, origin: str) -> None:
        """RefusalError (unauthorized) unless `token` was minted for `origin` and is unexpired."""
        parts = token.split(".")
        # ASCII digits only: str.isdigit() also takes "²", which int() refuses
        if (
            len(parts) != 4
            or parts[0] != _VERSION
            or not (parts[1].isascii() and parts[1].isdigit() and len(parts[1]) <= 12)
            or not (token.isascii() and token.isprintable())
        ):
            raise RefusalError("unauthorized", "the access token is malformed", close=True)
        expiry, nonce, mac = int(parts[1]), parts[2], parts[3]
        if not hmac.compare_digest(mac.encode(), self._mac(expiry, nonce, origin).encode()):
            raise RefusalError("unauthorized", "the access token is not valid here", close=True)
        if expiry < self._clock():
            raise RefusalError(
                "unauthorized", "the access token has expired: get a new one", close=True
            )


def _host_of(origin: str) -> tuple[str, str]:
    """An Origin -> (scheme, host[:port]) ("", "") for "null" or garbage."""
    if not (origin.isascii() and origin.isprintable()):
        return ("", "")
    try:
        parts = urlsplit(origin)
    except ValueError:  # "http://[": an unclosed IPv6 bracket
        return ("", "")
    return (parts.scheme, parts.netloc) if parts.scheme in ("http", "https") else ("", "")


def host_name(host: str) -> str:
    """A Host header (or an origin's host[:port]) -> its lower-case name without port or
    trailing dot; "[::1]" keeps its brackets. "" for garbage."""
    host = host.strip().lower()
    if not (host.isascii() and host.isprintable()) or "@" in host or "/" in host:
        return ""
    if host.startswith("["):
        end = host.find("]")
        return host[: end + 1] if end > 0 else ""
    return host.rsplit(":", 1)[0].rstrip(".") if host.count(":") <= 1 else ""


def _is_ip_literal(name: str) -> bool:
    try:
        ipaddress.ip_address(name.strip("[]"))
    except ValueError:
        return False
    return True


@dataclasses.dataclass(frozen=True)
class Hosts:
    """The host names the gateway answers to, as web frameworks' allowed-hosts lists do:
    a page from any other name that resolves to the gateway's address (DNS rebinding: the
    attacker's domain re-bound to it, loopback included) gets nothing, not even the page.
    `names`: exact names, ".example.com" for it and its subdomains, "*" for any (only
    behind a proxy that checks Host itself). Always allowed: localhost (and *.localhost),
    and IP literals, which no DNS answer can re-bind; no Host at all (HTTP/1.0 health
    checks; every browser sends one)."""

    names: tuple[str, ...] = ()

    def allows(self, host: str | None) -> bool:
        if host is None:
            return True
        name = host_name(host)
        if not name:
            return False
        if name == "localhost" or name.endswith(".localhost") or _is_ip_literal(name):
            return True
        for listed in self.names:
            allowed = listed.lower().rstrip(".")
            if allowed in ("*", name):
                return True
            if allowed.startswith(".") and (name == allowed[1:] or name.endswith(allowed)):
                return True
        return False

    @classmethod
    def of(cls, names: str, origins: tuple[str, ...] = (), host: str = "") -> Hosts:
        """--allowed-hosts (comma-separated), plus the hosts of the allowed origins and the
        name the gateway binds (when it is a name)."""
        listed = [n.strip() for n in names.split(",") if n.strip()]
        listed += [host_name(_host_of(o)[1]) for o in origins if _host_of(o)[1]]
        if host and not _is_ip_literal(host) and host not in ("", "0.0.0.0", "::"):
            listed.append(host)
        return cls(tuple(dict.fromkeys(n for n in listed if n)))


@dataclasses.dataclass(frozen=True)
class Origins:
    """The allow-list. `allowed`: exact origins (`https://avatar.example.com`); with
    `local`, also http(s)://localhost, 127.0.0.1 and [::1] on any port; with `own`, the
    origin whose host is the one the request was sent to (the page the gateway served)."""

    allowed: tuple[str, ...] = ()
    local: bool = True
    own: bool = True

    def allows(self, origin: str, host: str) -> bool:
        if origin.rstrip("/") in self.allowed:
            return True
        _scheme, netloc = _host_of(origin)
        if not netloc:
            return False
        if self.own and netloc == host:  # the Host itself was checked (Hosts)
            return True
        return self.local and host_name(netloc) in LOCAL_HOSTS


@dataclasses.dataclass
class Admission:
    trusted: bool  # the operator key: free persona text allowed
    how: str  # "key", "token" or "open", for the log


def bearer_matches(authorization: str, key: str) -> bool:
    """`Authorization: Bearer <key>` holds `key`, compared in constant time."""
    scheme, _, value = authorization.partition(" ")
    if scheme.lower() != "bearer":
        return False
    # surrogateescape: aiohttp's text of a header's non-UTF-8 bytes
    presented = value.strip().encode("utf-8", "surrogateescape")
    return hmac.compare_digest(presented, key.encode())


class Access:
    """The gateway's access checks on an HTTP request's headers."""

    def __init__(self, key: str | None, tokens: AccessTokens, origins: Origins) -> None:
        self._key, self.tokens, self.origins = key, tokens, origins

    @property
    def has_key(self) -> bool:
        return self._key is not None

    def _key_matches(self, authorization: str) -> bool:
        return self._key is not None and bearer_matches(authorization, self._key)

    def check_origin(self, headers: Mapping[str, str]) -> str:
        """The request's Origin when it is allowed; RefusalError otherwise (none included)."""
        origin = headers.get("Origin", "")
        if not origin:
            raise RefusalError("forbidden_origin", "no Origin: tokens are for browser pages")
        if not (origin.isascii() and origin.isprintable()):
            raise RefusalError("forbidden_origin", "the Origin is not an http(s) origin")
        if not self.origins.allows(origin, headers.get("Host", "")):
            raise RefusalError("forbidden_origin", "this page's origin may not use the gateway")
        return origin

    def mint(self, headers: Mapping[str, str]) -> str:
        """An access token for the page that asks (POST /access-token)."""
        # a browser marks a request another site made; an allowed origin still gets one
        return self.tokens.mint(self.check_origin(headers))

    def admit(self, headers: Mapping[str, str], protocols: list[str]) -> Admission:
        """A WebSocket upgrade -> who it is; RefusalError (close) when it may not connect.
        `protocols`: the subprotocols the client offered."""
        authorization = headers.get("Authorization", "")
        if authorization:
            if self._key_matches(authorization):
                return Admission(True, "key")
            raise RefusalError("unauthorized", "the operator key is wrong", close=True)
        token = next((p for p in protocols if p.startswith(TOKEN_PROTOCOL_PREFIX)), None)
        if headers.get("Origin"):
            try:
                origin = self.check_origin(headers)
            except RefusalError as refusal:
                raise RefusalError(refusal.code, refusal.message, close=True) from None
            if token is None:
                raise RefusalError(
                    "unauthorized", "no access token: POST /access-token first", close=True
                )
            self.tokens.verify(token.removeprefix(TOKEN_PROTOCOL_PREFIX), origin)
            return Admission(False, "token")
        if self._key is not None:
            raise RefusalError(
                "unauthorized", "no operator key (Authorization: Bearer)", close=True
            )
        return Admission(False, "open")


def offered_protocols(header: str) -> list[str]:
    """Sec-WebSocket-Protocol -> the offered subprotocols."""
    return [p.strip() for p in header.split(",") if p.strip()]
