"""A fuzzer of the gateway's public surface (issue 42), built on Hypothesis: random and
mutated JSON messages, binary frames, handshake headers and access tokens, each sent to a
real gateway (gateway.app.create_app served on a loopback socket by its own loop and
thread, tests/gateway_harness.py) in front of a fake Triton whose `vad` hears the
fuzzer's audio. Every example, whatever it sends, must leave:

- no `error` answered with the code `internal` (every code one of protocol.ERROR_CODES),
  no HTTP 5xx, every text frame the gateway sends strict JSON (no NaN, no Infinity);
- no ERROR record and no traceback logged by the gateway, aiohttp or asyncio, nothing
  reaching the gateway loop's exception handler;
- no connection slot held once the connection has ended (`edge.caps.open` and the
  address's count back where they were);
- the limits intact: a fresh, honest connection from the same address gets its `ready`.

CI runs a short run (the examples per test below, a few seconds in all); `make
test-extended` runs 800 examples a test (the short run's size before CI was cut to 8
minutes, issue 46). The long run, the same properties with many examples (and no per-test
timeout):

    GATEWAY_FUZZ_EXAMPLES=20000 .venv/bin/python -m pytest tests/test_gateway_fuzz.py

Hypothesis keeps no example database (`database=None`), and its other files go under
build/hypothesis (git-ignored). A failure prints the minimal example and a
`@reproduce_failure` blob that replays it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import math
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import hypothesis.configuration
import numpy as np
import pytest
from aiohttp import WSMsgType
from gateway_harness import GatewayThread
from hypothesis import (
    HealthCheck,
    currently_in_test_context,
    event,
    example,
    given,
    settings,
)
from hypothesis import strategies as st
from test_gateway_turns import FakeTriton

from avatar.animation.tables import EMOTIONS
from avatar.languages import NAMES as LANGUAGES
from avatar.pipeline.request import FACES, Controls
from gateway import protocol
from gateway.access import Origins
from gateway.app import Edge, create_app
from gateway.limits import ConnectionCaps, Limits
from gateway.options import SessionOptions

hypothesis.configuration.set_hypothesis_home_dir(Path(__file__).parents[1] / "build" / "hypothesis")

EXAMPLES = int(os.environ.get("GATEWAY_FUZZ_EXAMPLES", "0"))  # 0: CI's short run
if EXAMPLES:  # the long run takes longer than pytest's per-test timeout
    pytestmark = pytest.mark.timeout(0)

KEY = "fuzz operator key"
SECRET = "a fuzz secret of enough bytes"
PAGE = "http://localhost:8080"  # an allowed origin (local)
SITE = "https://avatar.example.com"  # an allowed origin (the list)
PERSONAS = {"guide": "You are a museum guide.", "chef": "You are a chef."}
ANSWER_S = 10.0  # the longest the gateway may take to answer an example's last message
RELEASE_S = 2.0  # ...and to give back the connection's slot once it has ended
GATEWAY_LOGGERS = ("gateway", "avatar", "aiohttp", "asyncio")
# the close codes a client may see: the protocol's, WebSocket's for a broken frame, and
# 1006 (no close frame: the gateway drops a client that has not answered its close within
# app.CLOSE_TIMEOUT_S, as a flooding one does not)
CLOSE_CODES = {1000, 1001, 1002, 1003, 1006, 1007, 1008, 1009, *protocol.CLOSE_CODES.values()}


def fuzz_settings(ci_examples: int) -> settings:
    return settings(
        max_examples=EXAMPLES or ci_examples,
        deadline=None,  # a loaded machine: the properties, not the timings
        database=None,
        print_blob=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


# ---------------------------------------------------------------------------- the gateway


class ListeningTriton(FakeTriton):
    """FakeTriton whose `vad` hears the fuzzer's audio (a loud chunk is speech), with an
    end-of-turn model; it forgets what it was asked (a long run makes many turns)."""

    async def speech_prob(self, stream, chunk: np.ndarray, *, session: str = "") -> float:
        return float(min(1.0, math.sqrt(float(np.mean(chunk**2))) * 10.0))

    async def turn_complete(self, audio, *, session: str = "") -> float:
        return 0.9

    async def transcribe(self, audio, prefix=(), language=None, *, session=""):
        self.passes.clear()
        return await super().transcribe(audio, prefix, language, session=session)

    def turn(self, *, session: str = "", **request):
        for kept in (self.turns, self.calls, self.affinity):
            kept.clear()
        return super().turn(session=session, **request)


class LogErrors(logging.Handler):
    """The ERROR records and tracebacks of GATEWAY_LOGGERS (aiohttp's own ERROR for a
    request its HTTP parser refuses is kept at DEBUG by the gateway: gateway.app)."""

    def __init__(self) -> None:
        super().__init__(logging.NOTSET)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno < logging.ERROR and not record.exc_info:
            return
        self.records.append(record)

    def take(self) -> list[str]:
        taken, self.records = self.records, []
        return [
            f"{r.name} {r.levelname}: {r.getMessage()}"
            + (f" ({r.exc_info[1]!r})" if r.exc_info and r.exc_info[1] else "")
            for r in taken
        ]


@dataclasses.dataclass
class Answer:
    """What the gateway answered one attempt: its HTTP status (101: upgraded), the JSON
    messages it sent and the WebSocket close code."""

    status: int = 101
    messages: list[Any] = dataclasses.field(default_factory=list)
    close_code: int | None = None
    problems: list[str] = dataclasses.field(default_factory=list)

    def text(self, data: str | bytes) -> None:
        """A text frame or a JSON body: strict JSON (no NaN or Infinity a browser cannot
        parse), and an error's code documented and never `internal`."""

        def constant(name: str):
            self.problems.append(f"not strict JSON ({name}): {data[:200]!r}")

        try:
            message = json.loads(data, parse_constant=constant)
        except ValueError:
            self.problems.append(f"not JSON: {data[:200]!r}")
            return
        self.messages.append(message)
        if isinstance(message, dict) and ("code" in message or message.get("type") == "error"):
            code = message.get("code")
            if code == "internal" or code not in protocol.ERROR_CODES:
                self.problems.append(f"answered {message}")


@dataclasses.dataclass(repr=False)
class Fuzz:
    """The gateway under fuzz and the test's client side (its own loop)."""

    gateway: GatewayThread
    edge: Edge
    loop: asyncio.AbstractEventLoop
    http: aiohttp.ClientSession
    errors: LogErrors
    clean: dict[str, Any] = dataclasses.field(default_factory=dict)  # the caps, unused

    def __repr__(self) -> str:
        return f"Fuzz(gateway on port {self.gateway.port})"

    def _repr_pretty_(self, printer, _cycle) -> None:  # in Hypothesis's examples
        printer.text(repr(self))

    def run(self, coroutine, timeout_s: float = 60.0):
        return self.loop.run_until_complete(asyncio.wait_for(coroutine, timeout_s))

    def caps(self) -> dict[str, Any]:
        """What the connections hold of the caps: all, per address (and, where the caps
        count them, those not yet talking and the sessions being answered)."""

        def held() -> dict[str, Any]:
            caps = self.edge.caps
            counts = {"open": caps.open, "by address": dict(caps.by_address)}
            counts.update({n: getattr(caps, n) for n in ("quiet", "sessions") if hasattr(caps, n)})
            return counts

        return self.gateway.call(held)

    def settled(self, before: dict[str, Any]) -> dict[str, Any]:
        """The caps once they are back at `before`, or after RELEASE_S."""
        deadline = time.monotonic() + RELEASE_S
        while (now := self.caps()) != before and time.monotonic() < deadline:
            time.sleep(0.005)
        return now

    def start(self) -> dict[str, Any]:
        """A clean start: what a failed example before may have kept is dropped."""
        self.errors.take()
        self.gateway.loop_errors.clear()
        if self.settled(self.clean) != self.clean:

            def fresh() -> None:
                self.edge.caps = ConnectionCaps(self.edge.limits)

            self.gateway.call(fresh)
        return self.caps()

    def problems(self, attempt: Callable[[], Any]) -> list[str]:
        """Run `attempt()` (a coroutine function -> Answer): what broke the properties."""
        before = self.start()
        answer = self.run(attempt())
        problems = list(answer.problems)
        if answer.status >= 500:
            problems.append(f"HTTP {answer.status}")
        if answer.close_code is not None and answer.close_code not in CLOSE_CODES:
            problems.append(f"closed with {answer.close_code}")
        after = self.settled(before)
        if after != before:
            problems.append(f"slot kept: {before} -> {after}")
        honest = self.run(self.honest())
        if honest is not None:
            problems.append(f"an honest connection afterwards: {honest}")
        elif (again := self.settled(after)) != after:
            problems.append(f"the honest connection's slot kept: {after} -> {again}")
        problems += self.errors.take()
        problems += [f"loop error: {c.get('message')} {c.get('exception')!r}" for c in
                     self.gateway.loop_errors]  # fmt: skip
        return problems

    def check(self, what: str, attempt: Callable[[], Any]) -> None:
        """Assert that `attempt()` broke none of the properties (and tell Hypothesis's
        statistics what the gateway answered)."""

        async def noted() -> Answer:
            answer = await attempt()
            if not currently_in_test_context():  # a test of its own, not Hypothesis's
                return answer
            if answer.status != 101:
                event(f"HTTP {answer.status}")
            for message in answer.messages:
                if isinstance(message, dict) and "type" in message:
                    event(f"{message.get('type')} {message.get('code', '')}".strip())
            return answer

        problems = self.problems(noted)
        assert not problems, f"{what}:\n  " + "\n  ".join(problems)

    async def honest(self) -> str | None:
        """None when a service with the key connects and gets `ready`, else what it got."""
        headers = {"Authorization": f"Bearer {KEY}"}
        try:
            async with self.http.ws_connect(self.gateway.url("/ws"), headers=headers) as ws:
                first = await ws.receive(timeout=ANSWER_S)
                if first.type != WSMsgType.TEXT or json.loads(first.data)["type"] != "ready":
                    return repr(first)
        except aiohttp.WSServerHandshakeError as error:
            return f"HTTP {error.status} {error.message}"
        return None


@pytest.fixture(scope="module")
def fuzz():
    limits = Limits(connects_per_s=1000.0, connect_burst=1000, audio_burst_s=8.0)
    env = {"AVATAR_SESSION_SECRET": SECRET, "AVATAR_GATEWAY_KEY": KEY}
    edge = Edge.from_environment(limits, Origins(allowed=(SITE,)), env)
    options = SessionOptions(personas=PERSONAS)
    triton = ListeningTriton()
    errors = LogErrors()
    loggers = [logging.getLogger(name) for name in GATEWAY_LOGGERS]
    for logger in loggers:
        logger.addHandler(errors)
    loop = asyncio.new_event_loop()
    try:
        with GatewayThread(lambda: create_app("unused:1", options, edge=edge, triton=triton)) as gw:
            http = loop.run_until_complete(_session())
            try:
                fuzz = Fuzz(gw, edge, loop, http, errors)
                fuzz.clean = fuzz.caps()
                yield fuzz
            finally:
                loop.run_until_complete(http.close())
    finally:
        loop.close()
        for logger in loggers:
            logger.removeHandler(errors)


async def _session() -> aiohttp.ClientSession:
    return aiohttp.ClientSession()


# ---------------------------------------------------------------------------- strategies


class Raw(str):
    """A JSON text written as is: 1e999, -0, NaN, a 5,000-digit integer, deep nesting."""

    def __repr__(self) -> str:
        more = f"...<{len(self)} characters>" if len(self) > 60 else ""
        return f"Raw({str(self)[:60]!r}{more})"

    def _repr_pretty_(self, printer, _cycle) -> None:  # Hypothesis prints examples so
        printer.text(repr(self))


@dataclasses.dataclass(frozen=True)
class Mutation:
    """Edits of a token `a.b.c.d` (an access token, a session token): each op in turn."""

    ops: tuple[tuple, ...]

    def apply(self, token: str) -> str:
        for op, *args in self.ops:
            parts = token.split(".")
            if op == "part":  # a part replaced
                index, value = args
                parts[index % len(parts)] = value
            elif op == "digits":  # a part's digits written in another script
                index, table = args
                i = index % len(parts)
                parts[i] = parts[i].translate(DIGIT_SCRIPTS[table])
            elif op == "pad":  # leading zeros, spaces, a sign
                index, prefix = args
                parts[index % len(parts)] = prefix + parts[index % len(parts)]
            elif op == "drop":
                del parts[args[0] % len(parts)]
            elif op == "add":
                parts.insert(args[0] % (len(parts) + 1), args[1])
            elif op == "char":  # one character replaced
                where, char = args
                if token:
                    i = where % len(token)
                    token = token[:i] + char + token[i + 1 :]
                continue
            elif op == "cut":
                token = token[: args[0] % (len(token) + 1)]
                continue
            token = ".".join(parts)
        return token


@dataclasses.dataclass(frozen=True)
class Own:
    """The connection's own session token (its `ready`), mutated."""

    mutation: Mutation


DIGIT_SCRIPTS = {
    name: str.maketrans("0123456789", digits)
    for name, digits in {
        "superscript": "⁰¹²³⁴⁵⁶⁷⁸⁹",
        "subscript": "₀₁₂₃₄₅₆₇₈₉",
        "fullwidth": "０１２３４５６７８９",
        "arabic": "٠١٢٣٤٥٦٧٨٩",
        "devanagari": "०१२३४५६७८९",
        "math": "𝟎𝟏𝟐𝟑𝟒𝟓𝟔𝟕𝟖𝟗",
    }.items()
}
ODD_CHARS = "¹²³٣０é\u00a0\u200b\u202e\ufeff\u0301ı\u212a\U0001f600\x7f\x00\t ,;=\"'\\/:%+-_.="
ODD_NUMBERS = [
    "1e999", "-1e999", "1E400", "1e-999", "-0", "-0.0", "0e0", "0.0", "4.9e-324", "1e308",
    "NaN", "Infinity", "-Infinity", "2.5", "1.0", "30.0", "0.7", "1e2", "9223372036854775807",
    "9223372036854775808", "-9223372036854775809", "18446744073709551616",
    "123456789012345678901234567890.5", '"\\ud800"', '"\\u0000"',
]  # fmt: skip


def many_digits(digits: int) -> Raw:
    """An integer of `digits` digits (Python parses at most 4,300), or its negative."""
    return Raw(("-" if digits % 2 else "") + "1" + "0" * (digits - 1))


odd_numbers = st.sampled_from(ODD_NUMBERS).map(Raw) | st.sampled_from([400, 4300, 4301, 5000]).map(
    many_digits
)
odd_text = st.text(st.sampled_from(ODD_CHARS) | st.characters(codec="utf-8"), max_size=12)
scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text(max_size=24)
    | odd_text
    | odd_numbers
)
json_values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=10,
)
# 1e999 levels is beyond any parser: how deep nesting goes (the 1 MiB frame cap: 150,000)
depths = st.sampled_from([100, 1000, 5000, 20_000, 50_000, 150_000]) | st.integers(1, 3000)


@st.composite
def nested(draw, inner=json_values) -> Raw:
    """A value inside `depth` arrays or objects."""
    depth, core = draw(depths), dump(draw(inner))
    if draw(st.booleans()):
        return Raw("[" * depth + core + "]" * depth)
    return Raw('{"a":' * depth + core + "}" * depth)


def mutations(parts: int = 4) -> st.SearchStrategy[Mutation]:
    index = st.integers(0, parts)
    part_values = (
        st.sampled_from(["", " ", "0", "-1", "+1", "1.5", "9" * 30, "9" * 5000, "a1", "s1"])
        | odd_text
        | st.text(max_size=40)
    )
    op = st.one_of(
        st.tuples(st.just("part"), index, part_values),
        st.tuples(st.just("digits"), index, st.sampled_from(sorted(DIGIT_SCRIPTS))),
        st.tuples(st.just("pad"), index, st.sampled_from(["0", "00", " ", "+", "-", "\u00a0"])),
        st.tuples(st.just("drop"), index),
        st.tuples(st.just("add"), index, part_values),
        st.tuples(st.just("char"), st.integers(0, 200), st.sampled_from(ODD_CHARS) | odd_text),
        st.tuples(st.just("cut"), st.integers(0, 200)),
    )
    return st.lists(op, min_size=0, max_size=3).map(lambda ops: Mutation(tuple(ops)))


def dump(value: Any, own: str = "") -> str:
    """JSON text of `value` (Raw as is; Own: the connection's token, mutated)."""
    if isinstance(value, Raw):
        return str(value)
    if isinstance(value, Own):
        return json.dumps(value.mutation.apply(own), ensure_ascii=False)
    if isinstance(value, dict):
        fields = (f"{json.dumps(k, ensure_ascii=False)}:{dump(v, own)}" for k, v in value.items())
        return "{" + ",".join(fields) + "}"
    if isinstance(value, list):
        return "[" + ",".join(dump(v, own) for v in value) + "]"
    return json.dumps(value, ensure_ascii=False)


CONTROL_VALUES = {
    "fps": st.floats(0, 200) | st.sampled_from([24, 25, 30, 60]),
    "alpha": st.floats(-0.5, 1.5),
    "emotion": st.sampled_from([*EMOTIONS, "auto", "", "HAPPY"]),
    "intensity": st.floats(-1, 2),
    "persona": st.text(max_size=50) | st.builds(lambda n: "p" * n, st.integers(3990, 4010)),
    "max_tokens": st.integers(-2, 600),
    "seed": st.integers(-1, 2**64),
    "render": st.booleans(),
    "face": st.sampled_from([*FACES, "photo"]),
    "language": st.sampled_from([*LANGUAGES, "", "en-US", "zh_CN", "english", "x" * 40]),
    "end_silence_s": st.floats(0, 3),
    "persona_preset": st.sampled_from([*PERSONAS, "", "pirate"]),
}
assert set(CONTROL_VALUES) >= {f.name for f in dataclasses.fields(Controls)}
control_names = st.sampled_from(sorted(CONTROL_VALUES)) | st.text(max_size=10)


@st.composite
def controls(draw) -> dict:
    """A `controls` object: each field plausible, or of any type, odd or deep."""
    values = {}
    for name in draw(st.lists(control_names, max_size=5, unique=True)):
        plausible = CONTROL_VALUES.get(name, json_values)
        kind = draw(st.sampled_from([plausible, plausible, odd_numbers, odd_numbers, json_values]))
        values[name] = draw(kind | nested()) if kind is json_values else draw(kind)
    return values


text_values = (
    st.text(max_size=60)
    | odd_text
    | st.builds(lambda c, n: c * n, st.sampled_from("a \u00e9\U0001f600"), st.integers(1990, 2010))
)
messages = st.one_of(
    st.fixed_dictionaries({"type": st.just("text"), "text": st.text(min_size=1, max_size=40)}),
    st.fixed_dictionaries({"type": st.just("text"), "text": text_values | json_values}),
    st.fixed_dictionaries({"type": st.just("controls"), "controls": controls()}),
    st.fixed_dictionaries({"type": st.just("controls"), "controls": controls() | json_values}),
    st.fixed_dictionaries({"type": st.just("interrupt")}),
    st.fixed_dictionaries({"type": st.just("ping"), "t": json_values | odd_numbers}),
    st.fixed_dictionaries(
        {"type": st.just("resume"), "session_token": st.builds(Own, mutations()) | json_values}
    ),
)


@st.composite
def text_frames(draw) -> TextFrame:
    """A client message, maybe mutated, as the text of a frame (given the session's
    token)."""
    message = dict(draw(messages))
    for key, value in draw(st.dictionaries(st.text(max_size=8), json_values, max_size=2)).items():
        message.setdefault(key, value)  # extra fields
    how = draw(
        st.sampled_from(["as is"] * 6 + ["type", "no type", "wrapped", "cut", "char", "twice"])
    )
    if how == "type":
        message["type"] = draw(st.sampled_from(["TEXT", "ping ", "text\x00", ""]) | json_values)
    elif how == "no type":
        message.pop("type")
    elif how == "wrapped":
        message = draw(st.sampled_from([[message], {"type": message}, {"message": message}]))
    edit = draw(st.tuples(st.integers(0, 10**6), st.sampled_from(ODD_CHARS + '{}[]"')))
    return TextFrame(message, how, edit)


@dataclasses.dataclass(frozen=True)
class TextFrame:
    message: Any
    how: str
    edit: tuple[int, str]

    def text(self, own: str) -> str:
        text = dump(self.message, own)
        at, char = self.edit[0] % (len(text) + 1), self.edit[1]
        if self.how == "cut":
            return text[:at]
        if self.how == "char":
            return text[:at] + char + text[at + 1 :]
        if self.how == "twice":  # a key given twice: the later one wins in Python
            return text[:-1] + ',"type":' + json.dumps(char) + "}"
        return text


def mic_frame(samples: int, level: int, seed: int) -> bytes:
    noise = np.random.default_rng(seed).normal(0.0, level, samples)
    return b"\x01" + np.clip(noise, -32768, 32767).astype("<i2").tobytes()


binary_frames = st.one_of(
    st.builds(
        mic_frame,
        st.integers(0, 16_001),
        st.sampled_from([0, 30, 400, 3000, 12_000, 32_767]),
        st.integers(0, 2**16),
    ),
    st.binary(max_size=64),
    st.builds(lambda n: b"\x01" + b"\x10" * n, st.integers(0, 41)),  # odd lengths
    st.builds(lambda k, body: bytes([k]) + body, st.integers(0, 255), st.binary(max_size=16)),
)


@st.composite
def frame(draw) -> TextFrame | Raw | bytes:
    """A frame of a client: most often a message, then MIC frames, garbage, deep nesting."""
    kind = draw(st.sampled_from(["message"] * 5 + ["binary"] * 3 + ["not JSON", "nested"]))
    if kind == "message":
        return draw(text_frames())
    if kind == "binary":
        return draw(binary_frames)
    if kind == "not JSON":
        return draw(st.builds(Raw, st.text(max_size=40) | odd_text))
    return TextFrame(draw(nested(messages)), "as is", (0, ""))


frames = st.lists(frame(), min_size=1, max_size=12)


# ---------------------------------------------------------------------------- raw HTTP


UPGRADE = [
    ("Connection", b"Upgrade"),
    ("Upgrade", b"websocket"),
    ("Sec-WebSocket-Version", b"13"),
    ("Sec-WebSocket-Key", b"dGhlIHNhbXBsZSBub25jZQ=="),
]
CLOSE_FRAME = b"\x88\x82\x00\x00\x00\x00\x03\xe8"  # masked (a zero mask), code 1000


async def raw_request(
    port: int, method: str, path: str, headers: list[tuple[str, bytes]]
) -> Answer:
    """One request written byte by byte (header values as given, non-ASCII included);
    after an upgrade, the gateway's first messages, then the client goes away."""
    answer = Answer(status=0)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        lines = [f"{method} {path} HTTP/1.1".encode()]
        lines += [name.encode() + b": " + value for name, value in headers]
        if method == "GET":
            lines += [name.encode() + b": " + value for name, value in UPGRADE]
        else:
            lines.append(b"Content-Length: 0")
        writer.write(b"\r\n".join(lines) + b"\r\n\r\n")
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), ANSWER_S)
        except asyncio.IncompleteReadError:  # the parser hung up: a 400 of the server
            return dataclasses.replace(answer, status=400)
        status_line, *fields = head.decode("latin-1").split("\r\n")
        answer.status = int(status_line.split()[1])
        length = next(
            (int(f.split(":", 1)[1]) for f in fields if f.lower().startswith("content-length:")),
            None,
        )
        if answer.status != 101:
            body = await _body(reader, length)
            if body[:1] in (b"{", b"["):
                answer.text(body.decode())
            return answer
        for _ in range(3):  # ready, or error then close
            opcode, payload = await asyncio.wait_for(_frame(reader), ANSWER_S)
            if opcode == 0x1:
                answer.text(payload.decode())
                if answer.messages and answer.messages[-1].get("type") == "ready":
                    writer.write(CLOSE_FRAME)
                    break
            elif opcode == 0x8:
                answer.close_code = int.from_bytes(payload[:2], "big") if payload else 1005
                break
        return answer
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


async def _body(reader: asyncio.StreamReader, length: int | None) -> bytes:
    if length is not None:
        return await asyncio.wait_for(reader.readexactly(length), ANSWER_S)
    with contextlib.suppress(asyncio.TimeoutError):
        return await asyncio.wait_for(reader.read(1 << 16), 0.5)
    return b""


async def _frame(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """A server's (unmasked) WebSocket frame: (opcode, payload)."""
    first, second = await reader.readexactly(2)
    length = second & 0x7F
    if length == 126:
        length = int.from_bytes(await reader.readexactly(2), "big")
    elif length == 127:
        length = int.from_bytes(await reader.readexactly(8), "big")
    return first & 0x0F, await reader.readexactly(length)


# header values: what a client may write, in bytes (CR and LF would end the header)
header_text = st.text(st.characters(codec="utf-8", exclude_characters="\r\n"), max_size=30)
header_bytes = (
    header_text.map(lambda s: s.encode())
    | header_text.map(lambda s: s.encode("latin-1", "replace"))
    | st.binary(max_size=30).map(lambda b: b.replace(b"\r", b"").replace(b"\n", b""))
)
hosts = st.sampled_from(
    ["localhost", "localhost:8080", "127.0.0.1", "[::1]", "[::1]:8080", "[", "[::1", "]",
     "evil.example", "avatar.example.com", "LOCALHOST", "localhost.", "xn--80ak6aa92e.com",
     "ｌｏｃａｌｈｏｓｔ", "locälhost", "localhost:99999", "localhost:-1", "localhost:", ":80",
     "user@localhost", "localhost:8080@evil.example", "", " "]
)  # fmt: skip
origins = st.one_of(
    st.sampled_from([PAGE, SITE, SITE + "/", "null", "http://[", "https://[::1", "http://]",
                     "file://", "http://", "HTTP://LOCALHOST", "http://localhost:8080/x?y#z",
                     "javascript:alert(1)", "http://[::1]:", "http://[v1.x]", "http://[::ffff:"]),
    st.builds(lambda s, h: f"{s}://{h}", st.sampled_from(["http", "https", "ws", "", "h\u0442tp"]),
              hosts | header_text),
)  # fmt: skip
TOKEN = "a1.1700000000.0123456789abcdef.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"


@st.composite
def protocols(draw) -> str:
    offered = draw(
        st.lists(
            st.sampled_from(["avatar.v1", "access.", "access." + TOKEN, "ACCESS.x", ""])
            | st.builds(lambda m: "access." + m.apply(TOKEN), mutations())
            | header_text,
            max_size=4,
        )
    )
    return draw(st.sampled_from([", ", ",", " ,  ", ";"])).join(offered)


authorizations = st.one_of(
    st.sampled_from([f"Bearer {KEY}", f"bearer   {KEY}  ", "Bearer", "Bearer ", "Basic a2V5",
                     f"Bearer {KEY}\u00e9", f"Bearer {KEY[:-1]}\u00b9", "Bearer \u00ff" * 3]),
    st.builds(lambda s: "Bearer " + s, header_text),
    header_text,
)  # fmt: skip
forwarded = st.lists(
    st.sampled_from(["1.2.3.4", "::1", "127.0.0.1", "unknown", "[", "999.999.999.999", "", "ü"])
    | header_text,
    max_size=4,
).map(", ".join)
HEADER_VALUES = {
    "Origin": origins,
    "Host": hosts,
    "Sec-WebSocket-Protocol": protocols(),
    "Authorization": authorizations,
    "X-Forwarded-For": forwarded,
}


@st.composite
def handshake_headers(draw) -> list[tuple[str, bytes]]:
    """Some of the five headers, odd, repeated or in bytes that are no UTF-8; the real
    Host unless it is one of them."""
    headers = []
    for _ in range(draw(st.integers(0, 5))):
        name = draw(st.sampled_from(sorted(HEADER_VALUES)))
        value = draw(st.sampled_from([HEADER_VALUES[name].map(str.encode)] * 3 + [header_bytes]))
        value = draw(value)
        headers.append((draw(st.sampled_from([name, name.lower(), name.upper()])), value))
    return headers


# ---------------------------------------------------------------------------- the properties


async def converse(fuzz: Fuzz, trusted: bool, sent: list) -> Answer:
    """Connect (the operator key, or a page's access token), send `sent` in order, then a
    ping; read what comes back until its pong or the close."""
    answer = Answer()
    if trusted:
        headers, offered = {"Authorization": f"Bearer {KEY}"}, ()
    else:
        token = fuzz.edge.access.tokens.mint(PAGE)
        headers, offered = {"Origin": PAGE}, ("avatar.v1", "access." + token)
    last = {"type": "ping", "t": "the fuzzer's last"}
    url = fuzz.gateway.url("/ws")
    async with fuzz.http.ws_connect(url, headers=headers, protocols=offered, max_msg_size=0) as ws:
        ready = await ws.receive(timeout=ANSWER_S)
        answer.text(ready.data)
        own = answer.messages[0].get("session_token", "")
        with contextlib.suppress(ConnectionError, RuntimeError, aiohttp.ClientError):
            for frame in [*sent, Raw(json.dumps(last))]:
                if isinstance(frame, bytes):
                    await ws.send_bytes(frame)
                else:
                    await ws.send_str(frame.text(own) if isinstance(frame, TextFrame) else frame)
        while True:
            try:
                message = await ws.receive(timeout=ANSWER_S)
            except asyncio.TimeoutError:
                answer.problems.append(f"no answer to the last ping in {ANSWER_S:g} s")
                break
            if message.type == WSMsgType.TEXT:
                answer.text(message.data)
                if answer.messages[-1] == {"type": "pong", "t": last["t"]}:
                    break
            elif message.type != WSMsgType.BINARY:  # closed
                break
    answer.close_code = ws.close_code
    return answer


# Explicit examples (tried first, every run): issue 42's probes and what the fuzzer found.
@fuzz_settings(ci_examples=200)
@given(trusted=st.booleans(), sent=frames)
@example(trusted=False, sent=[TextFrame({"type": "controls", "controls": {"seed": Raw("1e999")}},
                                        "as is", (0, ""))])  # fmt: skip
@example(trusted=True, sent=[Raw("[" * 50_000 + "]" * 50_000)])
@example(trusted=True, sent=[Raw('{"type": "controls", "controls": {"fps": 1%s}}' % ("0" * 400))])
@example(trusted=False, sent=[Raw('{"type": "controls", "controls": {"persona_preset": []}}')])
@example(
    trusted=True,
    sent=[Raw('{"type": "ping", "t": NaN}'), Raw('{"type": "ping", "t": 1%s}' % ("0" * 4300))],
)
def test_messages_and_frames(fuzz: Fuzz, trusted: bool, sent: list) -> None:
    """Random and mutated JSON messages, MIC frames and garbage on one connection."""
    fuzz.check("messages", lambda: converse(fuzz, trusted, sent))


@fuzz_settings(ci_examples=200)
@given(
    request=st.sampled_from([("GET", "/ws"), ("POST", "/access-token"), ("GET", "/ws?x=%ff")]),
    headers=handshake_headers(),
)
@example(request=("GET", "/ws"), headers=[("Origin", b"http://[")])
@example(request=("POST", "/access-token"), headers=[("Origin", b"http://[")])
def test_handshakes(fuzz: Fuzz, request: tuple[str, str], headers: list) -> None:
    """Handshakes (and POST /access-token) with odd Origin, Host, Sec-WebSocket-Protocol,
    Authorization and X-Forwarded-For values."""
    if not any(name.lower() == "host" for name, _ in headers):
        headers = [("Host", f"127.0.0.1:{fuzz.gateway.port}".encode()), *headers]
    method, path = request
    fuzz.check(f"{method} {path}", lambda: raw_request(fuzz.gateway.port, method, path, headers))


@fuzz_settings(ci_examples=150)
@given(
    origin=st.sampled_from([PAGE, SITE]) | origins,
    mutation=mutations(),
    around=st.sampled_from(["avatar.v1, {}", "{}", "{}, avatar.v1", "{}, {}"]),
    encoding=st.sampled_from(["utf-8", "latin-1"]),
)
@example(
    origin=SITE,
    mutation=Mutation((("char", 40, "\u00e9"),)),  # in the MAC
    around="avatar.v1, {}",
    encoding="utf-8",
)
@example(
    origin=PAGE,
    mutation=Mutation((("digits", 1, "superscript"),)),
    around="avatar.v1, {}",
    encoding="utf-8",
)
def test_access_tokens(fuzz: Fuzz, origin: str, mutation: Mutation, around, encoding) -> None:
    """A page's valid access token, mutated (non-ASCII, other scripts' digits, parts
    empty, dropped or added), offered from its origin or another."""
    token = "access." + mutation.apply(fuzz.edge.access.tokens.mint(PAGE))
    offered = around.replace("{}", token).encode(encoding, "replace")
    headers = [
        ("Host", f"127.0.0.1:{fuzz.gateway.port}".encode()),
        ("Origin", origin.encode(encoding, "replace")),
        ("Sec-WebSocket-Protocol", offered),
    ]
    fuzz.check("token", lambda: raw_request(fuzz.gateway.port, "GET", "/ws", headers))
