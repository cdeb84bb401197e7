"""The IRC chat adapter (broadcast/chat/irc.py) against a real IRC server: Debian's ngIRCd,
started by the test on a free loopback port from a config in tmp_path (in the foreground,
no daemon). The adapter joins a channel, a second raw IRC client (the viewer) talks in it,
the questions reach the queue with the viewers' names, the anchor's lines reach the viewer,
paced; when the server restarts the adapter comes back by itself. Twitch's line format
(IRCv3 tags) is checked on lines from its documentation."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import socket
import ssl
import subprocess
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broadcast.chat.adapters import ChatAdapter
from broadcast.chat.irc import (
    IRC_LINE_BYTES,
    MAX_LINE_BYTES,
    IrcChat,
    IrcSettings,
    format_line,
    parse_line,
    split_text,
)
from broadcast.chat.messages import ChatMessage
from broadcast.chat.queue import ChatQueue, ModerationRules, Verdict

NGIRCD = shutil.which("ngircd") or "/usr/sbin/ngircd"
CHANNEL = "#show"


def test_twitch_lines_parse_with_their_tags() -> None:
    # from dev.twitch.tv/docs/chat/irc (PRIVMSG with tags), display name escaped as Twitch does
    line = parse_line(
        "@badge-info=;badges=turbo/1;color=#0D4200;display-name=Ron\\sL\\:o;emotes=25:0-4;"
        "first-msg=0;id=b34ccfc7;mod=0;room-id=1337;tmi-sent-ts=1507246572675;turbo=1;"
        "user-id=1337;user-type=global_mod :ronni!ronni@ronni.tmi.twitch.tv PRIVMSG #ronni "
        ":Kappa Keepo Kappa"
    )
    assert (line.command, line.nick, line.params) == (
        "PRIVMSG",
        "ronni",
        ("#ronni", "Kappa Keepo Kappa"),
    )
    assert line.tags["display-name"] == "Ron L;o" and line.tags["badge-info"] == ""
    assert parse_line("PING :tmi.twitch.tv").params == ("tmi.twitch.tv",)
    assert parse_line(":tmi.twitch.tv RECONNECT").command == "RECONNECT"
    assert parse_line("@a=x\\\\y\\b\\ :n PRIVMSG #c ::-) hi").tags["a"] == "x\\yb"
    assert parse_line(":n!u@h PRIVMSG #c ::-) hi").params[1] == ":-) hi"
    with pytest.raises(ValueError):
        parse_line("@tags-only")


@given(st.text(max_size=300))
def test_any_line_parses_or_is_refused_as_a_value_error(raw: str) -> None:
    try:
        line = parse_line(raw)
    except ValueError:
        return
    assert line.command and all(isinstance(p, str) for p in line.params)


def test_lines_sent_cannot_inject_and_fit_the_limit() -> None:
    assert format_line("PRIVMSG", "#c", "hi there") == b"PRIVMSG #c :hi there\r\n"
    with pytest.raises(ValueError, match="CR, LF"):
        format_line("PRIVMSG", "#c", "hi\r\nQUIT :bye")
    pieces = split_text("déjà vu " * 100, 100)
    assert (
        all(len(p.encode()) <= 100 for p in pieces)
        and " ".join(pieces) == ("déjà vu " * 100).strip()
    )
    assert split_text("é" * 80, 101) == ["é" * 50, "é" * 30]  # never half a character
    settings = IrcSettings.from_url("ircs://irc.chat.twitch.tv/yourchannel", nick="bot")
    assert (settings.port, settings.tls, settings.channel) == (6697, True, "#yourchannel")
    assert IrcSettings.from_url("irc://127.0.0.1:7000/#a", nick="b").port == 7000
    for url in ("http://x/#a", "irc://host"):
        with pytest.raises(ValueError, match="irc://"):
            IrcSettings.from_url(url, nick="b")
    with pytest.raises(ValueError, match="AVATAR_IRC_PASSWORD"):
        IrcSettings.from_url("ircs://bot:oauth:secret@irc.chat.twitch.tv/c", nick="bot")
    with pytest.raises(ValueError, match="channel"):
        IrcSettings("h", "#bad channel", "bot")
    with pytest.raises(ValueError, match="nick"):
        IrcSettings("h", "#c", "bad\r\nnick")


# --- a real server ------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Ngircd:
    """ngIRCd in the foreground on `port`, from a config of its own; restartable."""

    def __init__(self, folder: Path, port: int, tls: tuple[int, Path, Path] | None = None) -> None:
        """`tls`: (port, certificate, key) for a TLS port beside the plain one."""
        self.port, self.config = port, folder / "ngircd.conf"
        self.log = folder / "ngircd.log"
        self.config.write_text(
            "[Global]\n"
            "Name = irc.test.local\n"
            "Info = broadcast chat test\n"
            "AdminInfo1 = test\nAdminInfo2 = test\nAdminEMail = test@irc.test.local\n"
            "Listen = 127.0.0.1\n"
            f"Ports = {port}\n"
            'MotdPhrase = "test server"\n'
            "[Limits]\n"
            "MaxConnectionsIP = 0\n"
            "MaxPenaltyTime = 0\n"  # the viewer sends faster than a person would
            "[Options]\n"
            "PAM = no\nIdent = no\nDNS = no\n"
            + (f"[SSL]\nPorts = {tls[0]}\nCertFile = {tls[1]}\nKeyFile = {tls[2]}\n" if tls else "")
        )
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                [NGIRCD, "--nodaemon", "--config", str(self.config)], stdout=log, stderr=log
            )
        deadline = time.monotonic() + 30  # with TLS it first makes DH parameters
        while time.monotonic() < deadline:
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.port), 0.2),
            ):
                return
            if self.process.poll() is not None:
                break
            time.sleep(0.05)
        raise RuntimeError(f"ngircd did not start: {self.log.read_text()[-2000:]}")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None


def _require_ngircd() -> None:
    if not Path(NGIRCD).exists():
        pytest.skip("ngircd is not installed (scripts/setup.sh --tests installs it)")


@pytest.fixture()
def ngircd(tmp_path: Path) -> Iterator[Ngircd]:
    _require_ngircd()
    server = Ngircd(tmp_path, _free_port())
    server.start()
    try:
        yield server
    finally:
        server.stop()


class Viewer:
    """A raw IRC client: registers, joins, says lines, reads what the channel says."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def join(cls, port: int, nick: str) -> Viewer:
        viewer = cls(*await asyncio.open_connection("127.0.0.1", port))
        viewer.send(f"NICK {nick}", f"USER {nick} 0 * :{nick}", f"JOIN {CHANNEL}")
        await viewer.wait_for(lambda line: line.command == "366")  # end of NAMES: joined
        return viewer

    def send(self, *lines: str) -> None:
        self.writer.write(b"".join(line.encode() + b"\r\n" for line in lines))

    def say(self, text: str) -> None:
        self.send(f"PRIVMSG {CHANNEL} :{text}")

    async def wait_for(self, wanted: Callable, timeout: float = 5.0):
        async def read():
            while True:
                line = parse_line((await self.reader.readuntil(b"\n")).decode().rstrip("\r\n"))
                if line.command == "PING":
                    self.send(f"PONG :{line.params[-1]}")
                elif wanted(line):
                    return line

        return await asyncio.wait_for(read(), timeout)

    async def close(self) -> None:
        self.writer.close()
        await self.writer.wait_closed()


class Received:
    """What the adapter delivered, to a real queue."""

    def __init__(self, queue: ChatQueue) -> None:
        self.queue, self.messages = queue, []
        self.arrived = asyncio.Event()

    def __call__(self, message: ChatMessage) -> Verdict:
        self.messages.append(message)
        self.arrived.set()
        return self.queue.offer(message)

    async def until(self, count: int, timeout: float = 5.0) -> list[ChatMessage]:
        async def arrivals() -> None:
            while len(self.messages) < count:
                self.arrived.clear()
                await self.arrived.wait()

        await asyncio.wait_for(arrivals(), timeout)
        return self.messages


@contextlib.asynccontextmanager
async def running(chat: IrcChat, received: Received) -> AsyncIterator[asyncio.Task]:
    task = asyncio.create_task(chat.run(received, received.queue.withdraw_viewer))
    try:
        await asyncio.wait_for(chat.joined.wait(), 10)
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def _settings(port: int, **options) -> IrcSettings:
    defaults = {"say_interval_s": 0.3, "reconnect_min_s": 0.1, "reconnect_max_s": 0.5}
    return IrcSettings("127.0.0.1", CHANNEL, "anchor", port=port, **(defaults | options))


def test_viewers_questions_reach_the_queue_and_the_anchor_answers_in_the_room(ngircd) -> None:
    async def scenario() -> None:
        queue = ChatQueue(ModerationRules())
        received = Received(queue)
        chat = IrcChat(_settings(ngircd.port), password="")
        assert isinstance(chat, ChatAdapter)
        async with running(chat, received):
            ada = await Viewer.join(ngircd.port, "ada")
            bo = await Viewer.join(ngircd.port, "bo")
            ada.say("\x02What\x02 is your \x0304favourite\x03 colour?")
            await received.until(1)  # two connections' lines come in either order
            bo.say("what is your favourite colour")
            bo.say("\x01ACTION wonders where you live?\x01")
            bo.say("\x01VERSION\x01")  # CTCP: not chat
            bo.send("PRIVMSG anchor :a private message is not a question")
            ada.say("  ")
            messages = await received.until(4)
            await asyncio.sleep(0.2)  # nothing else is delivered
            assert len(messages) == 4 and {
                (m.source, m.viewer == m.viewer_id) for m in messages
            } == {("irc", True)}
            assert [m.text for m in messages if m.viewer == "bo"] == [
                "what is your favourite colour",
                "wonders where you live?",
            ]
            pending = queue.pending()
            assert [q.viewers for q in pending] == [("ada", "bo"), ("bo",)]
            assert pending[0].attribution() == "ada and bo ask: What is your favourite colour?"
            assert queue.counts["empty"] == 1

            # the anchor's lines: in order, each within a line, paced
            await chat.say("Answering ada and bo next.")
            await chat.say("x " * 300)  # 600 bytes: two lines
            started = time.monotonic()
            said = []
            for _ in range(3):
                line = await bo.wait_for(lambda line: line.nick == "anchor")
                said.append((line.nick, line.params[1], time.monotonic() - started))
            assert said[0][:2] == ("anchor", "Answering ada and bo next.")
            assert all(len(text.encode()) < IRC_LINE_BYTES - 100 for _, text, _ in said)
            assert "".join(text for _, text, _ in said[1:]).replace(" ", "") == "x" * 300
            assert said[2][2] - said[1][2] >= 0.25  # say_interval_s 0.3, less the clock's grain
            await ada.close()
            await bo.close()

    asyncio.run(scenario())


def test_the_adapter_reconnects_when_the_server_restarts(ngircd) -> None:
    async def scenario() -> None:
        queue = ChatQueue(ModerationRules())
        received = Received(queue)
        chat = IrcChat(_settings(ngircd.port, command="!ask"))
        async with running(chat, received):
            viewer = await Viewer.join(ngircd.port, "cy")
            viewer.say("just chatting")  # not a question: the room uses !ask
            viewer.say("!ask are you real?")
            await received.until(1)
            await viewer.close()

            await asyncio.to_thread(ngircd.stop)
            for _ in range(250):
                if not chat.joined.is_set():
                    break
                await asyncio.sleep(0.02)
            assert not chat.joined.is_set()
            await asyncio.sleep(0.5)  # the adapter retries against a closed port meanwhile
            await asyncio.to_thread(ngircd.start)
            await asyncio.wait_for(chat.joined.wait(), 10)
            assert chat.sessions == 2

            viewer = await Viewer.join(ngircd.port, "cy")
            viewer.say("!ASK what happened to the chat?")
            messages = await received.until(2)
            assert [m.text for m in messages] == ["are you real?", "what happened to the chat?"]
            await viewer.close()

    asyncio.run(scenario())


def test_a_taken_nick_gets_an_underscore(ngircd) -> None:
    async def scenario() -> None:
        received = Received(ChatQueue())
        first = IrcChat(_settings(ngircd.port))
        second = IrcChat(_settings(ngircd.port))
        async with running(first, received), running(second, received):
            assert (first.nick, second.nick) == ("anchor", "anchor_")

    asyncio.run(scenario())


def test_a_quiet_room_is_pinged_and_a_dead_server_left(ngircd) -> None:
    """Past idle_s of silence the adapter PINGs: ngIRCd answers and the session lives on. A
    server that stops answering (accepts, welcomes, then says nothing), or sends a line over
    MAX_LINE_BYTES, is left and connected to again."""

    async def scenario() -> None:
        received = Received(ChatQueue())
        chat = IrcChat(_settings(ngircd.port, idle_s=0.2, pong_timeout_s=1.0))
        async with running(chat, received):
            await asyncio.sleep(1.5)
            assert (chat.sessions, chat.joined.is_set()) == (1, True)

        connections: list[float] = []
        writers: list[asyncio.StreamWriter] = []

        async def mute_server(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            connections.append(time.monotonic())
            writers.append(writer)
            await reader.readuntil(b"CAP END\r\n")
            writer.write(b":mute 001 anchor :hi\r\n:anchor!a@h JOIN #show\r\n")
            if len(connections) == 2:
                writer.write(b":mute NOTICE #show :" + b"x" * MAX_LINE_BYTES + b"\r\n")
            with contextlib.suppress(OSError, asyncio.IncompleteReadError):
                while await reader.readuntil(b"\n"):
                    pass  # reads the PINGs, never answers

        server = await asyncio.start_server(mute_server, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        mute = IrcChat(_settings(port, idle_s=0.3, pong_timeout_s=0.3))
        async with running(mute, received):
            for _ in range(300):
                if len(connections) >= 3:
                    break
                await asyncio.sleep(0.01)
        server.close()
        for writer in writers:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
        assert len(connections) >= 3 and mute.sessions >= 2
        assert connections[1] - connections[0] >= 0.6  # idle_s + pong_timeout_s, then retry
        assert connections[2] - connections[1] < 0.6  # the long line: left at once

    asyncio.run(scenario())


def test_tls_with_the_servers_certificate_and_not_without(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """ircs:// as Twitch's port 6697: the adapter joins over TLS with a context that trusts
    the server's (self-signed) certificate, and never joins with the system's trust alone."""
    _require_ngircd()
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True,
    )  # fmt: skip
    key.chmod(0o644)  # ngIRCd reads it again after dropping root for "nobody" on REHASH
    tls_port = _free_port()
    server = Ngircd(tmp_path, _free_port(), tls=(tls_port, cert, key))
    server.start()

    async def scenario() -> None:
        received = Received(ChatQueue())
        url = f"ircs://127.0.0.1:{tls_port}/show"
        settings = IrcSettings.from_url(url, "anchor", say_interval_s=0.3, reconnect_min_s=0.1)
        trusting = IrcChat(settings, ssl_context=ssl.create_default_context(cafile=str(cert)))
        async with running(trusting, received):
            viewer = await Viewer.join(server.port, "di")  # the plain port, the same channel
            viewer.say("is this encrypted?")
            assert (await received.until(1))[0].text == "is this encrypted?"
            await viewer.close()
        untrusting = IrcChat(settings)  # the system's CAs: the self-signed certificate fails
        task = asyncio.create_task(untrusting.run(received))
        await asyncio.sleep(0.5)
        assert not untrusting.joined.is_set()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    try:
        asyncio.run(scenario())
    finally:
        server.stop()
    assert "CERTIFICATE_VERIFY_FAILED" in caplog.text


async def _until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    for _ in range(int(timeout / 0.02)):
        if condition():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("not within the time")


def test_a_moderators_kick_withdraws_the_viewers_questions(ngircd) -> None:
    """The channel's operator (its first member) kicks a troll: the troll's own question
    leaves the queue, and their name leaves the question they shared. Kicked itself, the
    adapter comes back."""

    async def scenario() -> None:
        moderator = await Viewer.join(ngircd.port, "mod")  # first in: channel operator
        received = Received(ChatQueue())
        chat = IrcChat(_settings(ngircd.port))
        async with running(chat, received):
            troll = await Viewer.join(ngircd.port, "troll")
            troll.say("why is the sky blue")
            await received.until(1)
            moderator.say("Why is the sky blue?")
            troll.say("say something rude about the moderator")
            await received.until(3)
            assert [q.viewers for q in received.queue.pending()] == [("troll", "mod"), ("troll",)]
            moderator.send(f"KICK {CHANNEL} troll :be nice")
            await _until(lambda: len(received.queue.pending()) == 1)
            (question,) = received.queue.pending()
            assert (question.viewers, question.text) == (("mod",), "why is the sky blue")
            assert received.queue.removed == {"withdrawn": 1}

            moderator.send(f"KICK {CHANNEL} anchor :out")
            await _until(lambda: chat.sessions == 2 and chat.joined.is_set())
            await troll.close()
        await moderator.close()

    asyncio.run(scenario())


def test_twitch_lines_from_a_scripted_server() -> None:
    """What Twitch sends, replayed by a socket server (there is no Twitch here): tags give
    the display name, CLEARCHAT (ban) and CLEARMSG (deleted message) withdraw, a whole-chat
    CLEARCHAT does not, RECONNECT is obeyed; the adapter asked for both capabilities."""
    welcome = (
        ":tmi.twitch.tv CAP * ACK :twitch.tv/tags\r\n"
        ":tmi.twitch.tv CAP * ACK :twitch.tv/commands\r\n"
        ":tmi.twitch.tv 001 anchor :Welcome, GLHF!\r\n"
        ":anchor!anchor@anchor.tmi.twitch.tv JOIN #show\r\n"
    )
    script = [
        "@display-name=Ada_L;user-id=1 :ada!ada@ada.tmi.twitch.tv PRIVMSG #show :is it live?",
        "@display-name=Bo;user-id=2 :bo!bo@bo.tmi.twitch.tv PRIVMSG #show :what's for dinner",
        "@display-name=Cy;user-id=3 :cy!cy@cy.tmi.twitch.tv PRIVMSG #show :do you dream",
        "@room-id=9;target-user-id=2;tmi-sent-ts=1 :tmi.twitch.tv CLEARCHAT #show :bo",
        "@login=cy;target-msg-id=abc :tmi.twitch.tv CLEARMSG #show :do you dream",
        "@room-id=9 :tmi.twitch.tv CLEARCHAT #show",
        ":tmi.twitch.tv RECONNECT",
    ]
    registrations: list[bytes] = []

    async def twitch(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        registrations.append(await reader.readuntil(b"CAP END\r\n"))
        writer.write(welcome.encode())
        if len(registrations) == 1:
            writer.write("".join(f"{line}\r\n" for line in script).encode())
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while await reader.readuntil(b"\n"):
                pass
        writer.close()

    async def scenario() -> None:
        server = await asyncio.start_server(twitch, "127.0.0.1", 0)
        received = Received(ChatQueue())
        chat = IrcChat(_settings(server.sockets[0].getsockname()[1]), password="tok")
        async with running(chat, received):
            await _until(lambda: chat.sessions == 2)
        server.close()
        assert [m.viewer for m in received.messages] == ["Ada_L", "Bo", "Cy"]
        assert [q.viewers for q in received.queue.pending()] == [("Ada_L",)]
        assert received.queue.removed == {"withdrawn": 2}
        assert (
            b"CAP REQ twitch.tv/tags\r\nCAP REQ twitch.tv/commands\r\nPASS tok\r\n"
            in registrations[0]
        )

    asyncio.run(scenario())
