"""An IRC chat adapter: a small asyncio IRC client that joins one channel, delivers its
viewers' messages to the queue and posts the anchor's lines back, paced.

IRC is what Twitch chat speaks. To read a Twitch channel:

    settings = IrcSettings.from_url("ircs://irc.chat.twitch.tv:6697/yourchannel", nick="yourbot")
    chat = IrcChat(settings, password=read_secret(PASSWORD_ENV))

with the bot account's OAuth token (scope chat:read, and chat:edit to `say`) in
$AVATAR_IRC_PASSWORD, or in the file $AVATAR_IRC_PASSWORD_FILE names (never a flag: `ps`
shows argv), as `oauth:<token>` (the prefix is added for *.twitch.tv when missing). Read-only
without a token: nick `justinfan` + digits and no password. `ircs://` is TLS with the
system's certificate check (`ssl_context` for another); Twitch's TLS port is 6697.
In a busy room set `command` (e.g. "!ask"): otherwise every line of chatter ("lol", "hi")
is offered to the queue as a question.

The client asks for IRCv3 message tags and Twitch's commands (`CAP REQ :twitch.tv/tags`,
`CAP REQ :twitch.tv/commands`; a server without them answers NAK and nothing changes) and
takes the viewer's name from Twitch's `display-name` tag, else the nick. A moderator's KICK,
and Twitch's CLEARCHAT (ban, timeout) or CLEARMSG (a deleted message) of a viewer, withdraws
that viewer's questions. It answers PING, sends its own when the server goes quiet,
reconnects with a growing, jittered delay when the connection drops (or Twitch says
RECONNECT), reads lines of at most `MAX_LINE_BYTES`, and sends each `say` line within IRC's
512 bytes, one per `say_interval_s` (Twitch mutes a bot past 20 lines in 30 s).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import random
import ssl
import time
from collections.abc import Awaitable
from typing import TypeVar
from urllib.parse import urlsplit

from broadcast.chat.adapters import Deliver, Withdraw
from broadcast.chat.messages import ChatMessage
from broadcast.chat.text import clean

log = logging.getLogger(__name__)

PASSWORD_ENV = "AVATAR_IRC_PASSWORD"  # or the file $AVATAR_IRC_PASSWORD_FILE names
MAX_LINE_BYTES = 8191 + 512  # IRCv3: 8191 bytes of tags before the classic 512-byte line
IRC_LINE_BYTES = 512  # what one line may carry without tags, CRLF included
RELAY_PREFIX_BYTES = 120  # ":nick!user@host " that the server puts before our line
TWITCH_CAPABILITIES = ("twitch.tv/tags", "twitch.tv/commands")
_FORBIDDEN_IN_NAMES = set(" ,\x00\x07\r\n:")
T = TypeVar("T")
_TAG_ESCAPES = {":": ";", "s": " ", "\\": "\\", "r": "\r", "n": "\n"}


@dataclasses.dataclass(frozen=True)
class IrcLine:
    """One parsed line: `@tags :prefix COMMAND params... :trailing`."""

    command: str
    params: tuple[str, ...] = ()
    prefix: str = ""
    tags: dict[str, str] = dataclasses.field(default_factory=dict)

    @property
    def nick(self) -> str:
        """The sender's nick (the prefix up to "!")."""
        return self.prefix.split("!", 1)[0]


def _unescape_tag(value: str) -> str:
    out, chars = [], iter(value)
    for ch in chars:
        if ch == "\\":
            escaped = next(chars, "")  # a lone trailing backslash is dropped
            out.append(_TAG_ESCAPES.get(escaped, escaped))  # unknown: the char itself
        else:
            out.append(ch)
    return "".join(out)


def parse_line(line: str) -> IrcLine:
    """An IRC line (without CRLF) -> its parts; ValueError when it has no command."""
    tags: dict[str, str] = {}
    if line.startswith("@"):
        raw_tags, _, line = line[1:].partition(" ")
        for item in raw_tags.split(";"):
            key, _, value = item.partition("=")
            if key:
                tags[key] = _unescape_tag(value)
    line = line.lstrip(" ")
    prefix = ""
    if line.startswith(":"):
        prefix, _, line = line[1:].partition(" ")
    head, sep, trailing = line.partition(" :")
    parts = head.split()
    if not parts:
        raise ValueError("an IRC line without a command")
    params = parts[1:] + ([trailing] if sep else [])
    return IrcLine(parts[0].upper(), tuple(params), prefix, tags)


def format_line(command: str, *params: str) -> bytes:
    """A line to send, CRLF-terminated; the last parameter after " :" where it needs it (a
    space, empty, a leading ":"). ValueError when a parameter holds CR, LF or NUL (they would
    inject a second command) or a middle one a space."""
    for param in params:
        if any(ch in param for ch in "\r\n\x00"):
            raise ValueError("an IRC parameter may not contain CR, LF or NUL")
    *middle, last = params if params else ("",)
    if any(not p or " " in p or p.startswith(":") for p in middle):
        raise ValueError("only the last IRC parameter may be empty or hold spaces")
    if params and (not last or " " in last or last.startswith(":")):
        last = f":{last}"
    words = [command, *middle] + ([last] if params else [])
    return (" ".join(words) + "\r\n").encode()


def split_text(text: str, max_bytes: int) -> list[str]:
    """`text` in pieces of at most `max_bytes` UTF-8 bytes, cut at spaces where it can."""
    pieces: list[str] = []
    text = text.strip()
    while len(text.encode()) > max_bytes:
        cut = len(text.encode()[:max_bytes].decode(errors="ignore"))  # whole characters
        space = text.rfind(" ", 0, cut + 1)
        if space > 0:
            cut = space
        pieces.append(text[:cut].rstrip())
        text = text[cut:].lstrip()
    return [*pieces, text] if text else pieces


async def _within(awaitable: Awaitable[T], timeout: float) -> T:
    """`awaitable`'s result, or asyncio.TimeoutError after `timeout` s. Not asyncio.wait_for:
    before Python 3.12 it loses a cancellation that comes as the result arrives (the run
    task, cancelled as a line came in, read on for idle_s)."""
    task = asyncio.ensure_future(awaitable)
    try:
        done, _ = await asyncio.wait({task}, timeout=timeout)
    except asyncio.CancelledError:
        task.cancel()
        raise
    if not done:
        task.cancel()
        await asyncio.wait({task})  # a read gone before the next one starts on the stream
        raise asyncio.TimeoutError(f"no answer within {timeout:g} s")
    return task.result()


def _ignore(_viewer: str) -> None:
    return None


def _check_name(kind: str, name: str, first: str = "") -> None:
    if not name or len(name) > 50 or _FORBIDDEN_IN_NAMES & set(name) or not name.isprintable():
        raise ValueError(f"the IRC {kind} {name!r} is not valid: 1-50 printable characters")
    if first and name[0] not in first:
        raise ValueError(f"the IRC {kind} {name!r} must start with one of {first!r}")


@dataclasses.dataclass(frozen=True)
class IrcSettings:
    host: str
    channel: str  # "#name"
    nick: str
    port: int = 6667
    tls: bool = False
    request_tags: bool = True  # CAP REQ the TWITCH_CAPABILITIES (display names, moderation)
    command: str = ""  # e.g. "!ask": only messages that start with it are questions
    say_interval_s: float = 1.6  # Twitch: 20 lines per 30 s for a bot that is not a moderator
    outbox_lines: int = 20  # `say` lines waiting to be sent; more are dropped (logged)
    connect_timeout_s: float = 10.0
    register_timeout_s: float = 30.0  # from connecting to having joined the channel
    idle_s: float = 120.0  # silence after which we PING the server...
    pong_timeout_s: float = 20.0  # ...and give up on it when it stays silent this long
    reconnect_min_s: float = 1.0
    reconnect_max_s: float = 60.0

    def __post_init__(self) -> None:
        _check_name("channel", self.channel, "#&")
        _check_name("nick", self.nick)
        if not 0 < self.port < 65536:
            raise ValueError(f"the IRC port {self.port} is not a TCP port")

    @classmethod
    def from_url(cls, url: str, nick: str, **options: object) -> IrcSettings:
        """`irc://host[:port]/channel` (plain) or `ircs://...` (TLS); the channel's "#" may be
        left out (a URL reads "#" as a fragment)."""
        parts = urlsplit(url)
        if parts.scheme not in ("irc", "ircs") or not parts.hostname:
            raise ValueError(f"{url!r}: expected irc://host[:port]/channel or ircs://...")
        if parts.password is not None:  # a URL is a flag: `ps` shows it to every user
            raise ValueError(f"the IRC URL holds a password: put it in ${PASSWORD_ENV} instead")
        channel = parts.path.strip("/") or parts.fragment
        if not channel:
            raise ValueError(f"{url!r} names no channel: irc://host/channel")
        if channel[0] not in "#&":
            channel = f"#{channel}"
        tls = parts.scheme == "ircs"
        port = parts.port or (6697 if tls else 6667)
        return cls(parts.hostname, channel, nick, port=port, tls=tls, **options)  # type: ignore[arg-type]


class IrcChat:
    """The `ChatAdapter` for one IRC channel (see the module's docstring)."""

    name = "irc"

    def __init__(
        self,
        settings: IrcSettings,
        password: str = "",
        *,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.settings = settings
        if password and settings.host.endswith("twitch.tv") and not password.startswith("oauth:"):
            password = f"oauth:{password}"
        self._password = password
        self._ssl = ssl_context or (ssl.create_default_context() if settings.tls else None)
        self._outbox: asyncio.Queue[str] = asyncio.Queue(maxsize=settings.outbox_lines)
        self.joined = asyncio.Event()  # set while in the channel
        self.sessions = 0  # how many times it has joined (reconnects + 1)
        self.nick = settings.nick

    async def say(self, text: str) -> None:
        """Queue `text` (cleaned, split to fit a line) to be posted at the paced rate; a full
        outbox drops the line with a warning rather than flood the room."""
        overhead = len(f"PRIVMSG {self.settings.channel} :\r\n".encode()) + RELAY_PREFIX_BYTES
        for piece in split_text(clean(text), IRC_LINE_BYTES - overhead):
            try:
                self._outbox.put_nowait(piece)
            except asyncio.QueueFull:
                log.warning("IRC outbox full (%d lines): dropped a line", self._outbox.qsize())
                return

    async def run(self, deliver: Deliver, withdraw: Withdraw | None = None) -> None:
        """Connect, join and deliver until cancelled; reconnect when the connection ends.
        `withdraw(nick)`: the channel's moderators removed a viewer (KICK; Twitch's CLEARCHAT
        of a user, a ban or timeout, and CLEARMSG, a deleted message)."""
        settings, delay = self.settings, self.settings.reconnect_min_s
        while True:
            sessions = self.sessions
            try:
                await self._session(deliver, withdraw or _ignore)
                reason = "the server ended the connection"
            except (OSError, asyncio.TimeoutError, asyncio.LimitOverrunError) as error:
                # LimitOverrunError: a line longer than MAX_LINE_BYTES
                reason = f"{type(error).__name__}: {error}"
            finally:
                self.joined.clear()
            if self.sessions > sessions:  # it had joined: start the backoff again
                delay = settings.reconnect_min_s
            wait_s = delay * random.uniform(0.5, 1.0)  # jitter: bots of a room don't stampede
            log.warning(
                "IRC %s:%d %s: %s; reconnecting in %.1f s",
                settings.host,
                settings.port,
                settings.channel,
                reason,
                wait_s,
            )
            await asyncio.sleep(wait_s)
            delay = min(delay * 2, settings.reconnect_max_s)

    async def _session(self, deliver: Deliver, withdraw: Withdraw) -> None:
        settings = self.settings
        reader, writer = await _within(
            asyncio.open_connection(
                settings.host,
                settings.port,
                ssl=self._ssl,
                server_hostname=settings.host if self._ssl else None,
                limit=MAX_LINE_BYTES,
            ),
            settings.connect_timeout_s,
        )
        sender: asyncio.Task[None] | None = None
        try:
            self.nick = settings.nick
            writer.write(self._registration())
            registered_by = asyncio.get_running_loop().time() + settings.register_timeout_s
            while True:
                timeout = settings.idle_s
                if not self.joined.is_set():
                    timeout = registered_by - asyncio.get_running_loop().time()
                    if timeout <= 0:
                        raise asyncio.TimeoutError("not in the channel in time")
                raw = await self._read_line(reader, writer, timeout)
                if raw is None:
                    return
                if not raw.strip():
                    continue
                line = parse_line(raw)
                if line.command == "PING":
                    writer.write(format_line("PONG", *line.params[-1:]))
                elif line.command == "001":  # welcome: registered
                    writer.write(format_line("JOIN", settings.channel))
                elif line.command == "433" and not self.joined.is_set():  # nick in use
                    self.nick = f"{self.nick[:28]}_"
                    writer.write(format_line("NICK", self.nick))
                elif line.command == "JOIN" and self._is_me(line) and sender is None:
                    self.sessions += 1
                    self.joined.set()
                    log.info("IRC: joined %s as %s", settings.channel, self.nick)
                    sender = asyncio.create_task(self._send_said(writer))
                elif line.command == "PRIVMSG":
                    self._deliver(line, deliver)
                elif line.command in ("KICK", "CLEARCHAT", "CLEARMSG"):
                    if self._moderated(line, withdraw):
                        return  # we were kicked: join again on a new connection
                elif line.command in ("RECONNECT", "ERROR"):
                    log.info("IRC: %s %s", line.command, " ".join(line.params))
                    return
                elif line.command in ("464", "465", "NOTICE") and not self.joined.is_set():
                    log.warning("IRC: %s %s", line.command, " ".join(line.params))
        finally:
            if sender is not None:
                sender.cancel()
            writer.close()
            with contextlib.suppress(OSError, asyncio.TimeoutError):
                await asyncio.wait_for(writer.wait_closed(), 2.0)

    def _registration(self) -> bytes:
        # pipelined: a server handles them in order, so CAP END follows the ACK/NAK and
        # registration then completes; a server without CAP ignores it (421)
        lines = []
        if self.settings.request_tags:  # one request each: a server ACKs or NAKs a request whole
            lines += [format_line("CAP", "REQ", cap) for cap in TWITCH_CAPABILITIES]
        if self._password:
            lines.append(format_line("PASS", self._password))
        lines.append(format_line("NICK", self.nick))
        lines.append(format_line("USER", self.nick, "0", "*", self.nick))
        if self.settings.request_tags:
            lines.append(format_line("CAP", "END"))
        return b"".join(lines)

    async def _read_line(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, timeout: float
    ) -> str | None:
        """The next line without CRLF; None at the end of the stream. After `timeout` of
        silence once joined, a PING; a server silent past pong_timeout_s raises TimeoutError."""
        try:
            raw = await _within(reader.readuntil(b"\n"), timeout)
        except asyncio.TimeoutError:
            if not self.joined.is_set():
                raise
            writer.write(format_line("PING", "keepalive"))
            raw = await _within(reader.readuntil(b"\n"), self.settings.pong_timeout_s)
        except asyncio.IncompleteReadError:
            return None
        return raw.rstrip(b"\r\n").decode("utf-8", errors="replace")

    def _is_me(self, line: IrcLine) -> bool:
        return line.nick.casefold() == self.nick.casefold()

    def _deliver(self, line: IrcLine, deliver: Deliver) -> None:
        if len(line.params) < 2 or line.params[0].casefold() != self.settings.channel.casefold():
            return  # a private message to the bot, or another channel's
        if self._is_me(line):
            return
        text = line.params[1]
        if text.startswith("\x01"):  # CTCP: "/me asks..." is chat; VERSION, PING... are not
            body = text.strip("\x01")
            if not body.startswith("ACTION "):
                return
            text = body.removeprefix("ACTION ")
        command = self.settings.command
        if command:
            if text.split(" ", 1)[0].casefold() != command.casefold():
                return
            text = text[len(command) :].lstrip()
        viewer = line.tags.get("display-name") or line.nick
        message = ChatMessage(viewer, text, self.name, time.monotonic(), viewer_id=line.nick)
        try:
            verdict = deliver(message)
        except Exception:  # a broken consumer must not take the room's connection down
            log.exception("IRC: delivering a message failed")
            return
        log.debug("IRC %s: %s (%s)", line.nick, verdict.reason, verdict.message)

    def _moderated(self, line: IrcLine, withdraw: Withdraw) -> bool:
        """A moderator's removal of a viewer -> `withdraw(nick)`; True when it is us."""
        if not line.params or line.params[0].casefold() != self.settings.channel.casefold():
            return False
        if line.command == "CLEARMSG":  # Twitch: the deleted message's author in a tag
            nick = line.tags.get("login", "")
        else:  # KICK #channel nick; CLEARCHAT #channel nick (no nick: the whole chat cleared)
            nick = line.params[1] if len(line.params) > 1 else ""
        if not nick:
            return False
        if nick.casefold() == self.nick.casefold():
            log.warning("IRC: %s removed us from %s", line.nick or "the server", line.params[0])
            return True
        log.info("IRC: %s %s: withdrawing their questions", line.command, nick)
        try:
            withdraw(nick)
        except Exception:  # as for deliver: the connection outlives a broken consumer
            log.exception("IRC: withdrawing %s failed", nick)
        return False

    async def _send_said(self, writer: asyncio.StreamWriter) -> None:
        while True:
            text = await self._outbox.get()
            writer.write(format_line("PRIVMSG", self.settings.channel, text))
            await writer.drain()
            await asyncio.sleep(self.settings.say_interval_s)
