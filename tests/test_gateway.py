"""The live gateway (`python -m gateway`) as its own process against the real tritonserver:
spoken turns through the WebSocket protocol, barge-in, bad input; the protocol's frames."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from avatar import live_protocol as protocol
from clients.live import converse
from evals.clips import clips
from evals.wer import wer


def _ws(base: str) -> str:
    return base.replace("http://", "ws://") + "/ws"


def test_protocol_frames_round_trip() -> None:
    rng = np.random.default_rng(0)
    pcm = rng.uniform(-1, 1, 640).astype(np.float32)
    assert np.abs(protocol.parse_mic(protocol.mic_message(pcm)) - pcm).max() < 1e-4
    audio = protocol.parse_server_binary(protocol.audio_message(3, 7, 1.25, 22050, pcm))
    assert (audio.sentence, audio.turn, audio.start_s, audio.sample_rate) == (3, 7, 1.25, 22050)
    weights, pose = rng.random((4, 52), np.float32), rng.random((4, 3), np.float32)
    message = protocol.frames_message(1, 2, 0.5, 30.0, weights=weights, pose=pose)
    frames = protocol.parse_server_binary(message)
    assert frames.fps == 30.0 and np.array_equal(frames.weights, weights)
    assert np.array_equal(frames.pose, pose)
    for bad, match in [
        (b"", "empty"),
        (b"\x07\x00\x00", "kind 0x07"),
        (b"\x01\x00", "even count"),
        (b"\x01" + bytes(2 * 16_001), "at most 16000"),
    ]:
        with pytest.raises(protocol.ProtocolError, match=match):
            protocol.parse_mic(bad)


def test_portrait_rig_is_served_from_its_folder_and_404_without_one(tmp_path: Path) -> None:
    """`--portrait DIR`: /portrait/info says whether the page can draw the photo, the two
    files come from the folder; without a folder (or a file) a 404 that says why. No Triton:
    the gateway only connects to it for a session."""
    from aiohttp.test_utils import TestClient, TestServer

    from gateway.app import create_app

    rig, photo = b'{"size": 512, "vertices": [1.5, 2.0, 0.0]}', b"\x89PNG\r\n\x1a\n not really"
    (tmp_path / "rig.json").write_bytes(rig)
    (tmp_path / "photo.png").write_bytes(photo)
    (tmp_path / "rig.npz").write_bytes(b"not served")

    async def get(portrait: Path | None, path: str) -> tuple[int, str, bytes]:
        app = create_app("127.0.0.1:1", portrait=portrait)
        async with TestClient(TestServer(app)) as client:
            response = await client.get(path, headers={"Accept-Encoding": "gzip"})
            return response.status, response.content_type, await response.read()

    def fetch(portrait: Path | None, path: str) -> tuple[int, str, bytes]:
        return asyncio.run(get(portrait, path))

    assert fetch(tmp_path, "/portrait/rig.json") == (200, "application/json", rig)
    assert fetch(tmp_path, "/portrait/photo.png") == (200, "image/png", photo)
    status, _, body = fetch(tmp_path, "/portrait/info")
    assert (status, json.loads(body)) == (
        200,
        {"available": True, "rig": "/portrait/rig.json", "photo": "/portrait/photo.png"},
    )
    assert fetch(tmp_path, "/portrait/rig.npz")[0] == 404  # only the page's two files
    assert fetch(tmp_path, "/portrait/..%2Frig.npz")[0] == 404

    status, _, body = fetch(None, "/portrait/rig.json")
    assert status == 404 and b"started without --portrait" in body
    assert json.loads(fetch(None, "/portrait/info")[2]) == {"available": False}
    (tmp_path / "photo.png").unlink()
    status, _, body = fetch(tmp_path, "/portrait/photo.png")
    assert status == 404 and b"photo.png is missing" in body
    assert json.loads(fetch(tmp_path, "/portrait/info")[2]) == {"available": False}


def test_avatar_serve_web_gives_the_gateway_the_served_portrait_rig(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`avatar serve --web`: the rig is the `portrait_renderer` artifact folder, resolved
    through the export registry like every served model's; not served, no rig."""
    from export import registry
    from serving import cli

    asked: list[list[str]] = []

    def ensure_all(names: list[str]) -> dict[str, Path]:
        asked.append(names)
        return {name: tmp_path for name in names}

    monkeypatch.setattr(registry, "ensure_all", ensure_all)
    assert cli._portrait_rig(["vad", "avatar"]) is None and not asked
    assert cli._portrait_rig(["vad", "portrait_renderer"]) is None  # no rig.json, photo.png
    for name in ("rig.json", "photo.png"):
        (tmp_path / name).write_bytes(b"x")
    assert cli._portrait_rig(["vad", "portrait_renderer"]) == tmp_path
    assert asked == [["portrait_renderer"]] * 2


def test_page_and_health(gateway: str) -> None:
    with urllib.request.urlopen(gateway + "/") as response:
        page = response.read()
    assert b"/static/live.js" in page and b"/static/portrait.js" in page
    assert b'id="face-style"' in page
    for path in ("/static/live.js", "/static/portrait.js", "/static/mic-worklet.js"):
        with urllib.request.urlopen(gateway + path) as response:
            assert response.status == 200


def test_spoken_question_streams_transcript_sentences_audio_and_frames(gateway: str) -> None:
    """A question spoken in real time: endpointed by the served vad, answered on one clock."""
    clip = clips()[1]  # "What time does the museum open on Sunday?"
    reply = asyncio.run(converse(_ws(gateway), clip.audio, controls={"fps": 25, "seed": 1}))
    assert not reply.of("error"), reply.of("error")
    (transcript,) = reply.of("transcript")
    assert wer(clip.text, transcript["text"]) < 0.2
    sentences = reply.of("sentence")
    (end,) = reply.of("turn_end")
    assert sentences and end["reply"] and end["cancelled"] == ""
    assert {a.sentence for a in reply.audio} == {s["index"] for s in sentences}
    for a, s in zip(reply.audio, sentences, strict=True):
        assert a.start_s == pytest.approx(s["start_s"], abs=1e-4)
        assert len(a.pcm) / a.sample_rate == pytest.approx(s["duration_s"], abs=1e-3)
    for f, a in zip(reply.frames, reply.audio, strict=True):  # one clock for face and voice
        assert f.fps == 25 and f.weights.shape[1] == 52 and f.pose.shape[1] == 3
        assert f.start_s == a.start_s
        assert abs(len(f.weights) / f.fps - len(a.pcm) / a.sample_rate) <= 1 / f.fps
    ended = reply.at["speech_end1"]
    assert reply.at["transcript"] > ended and reply.at["first_audio_turn1"] > reply.at["transcript"]
    # the gateway transcribed at the first pause, while the endpointer still waited
    (start,) = reply.of("turn_start")
    assert start["speculative_asr"] is True and start["input"] == "audio"


# `extended` (13 s): the same two halves and pause are sent in CI to the speculating gateway
# (test_speech_after_a_pause_discards_the_speculative_turn), whose pass at the pause is
# discarded the same way, with the turn it started
@pytest.mark.extended
def test_a_pause_inside_a_question_discards_the_speculative_transcript(
    silence_gateway: str,
) -> None:
    """0.4 s of silence between two halves: ASR starts at the pause (0.2 s), the second half
    discards it, and the one turn hears both halves. The turn ends by silence alone here:
    the first half is a whole sentence, which the end-of-turn model may rightly end at the
    pause once the pause's transcript is back in time (with the passes a reply waits for
    served first, it is)."""
    first, second = clips()[6], clips()[0]  # "My favorite color is blue." "Hello, how are ..."
    pause = np.zeros(int(0.4 * 16_000), np.float32)
    audio = np.concatenate([first.audio, pause, second.audio])
    reply = asyncio.run(converse(_ws(silence_gateway), audio))
    assert len(reply.of("turn_start")) == 1, "the pause was taken for the end"
    (transcript,) = reply.of("transcript")
    assert wer(f"{first.text} {second.text}", transcript["text"]) < 0.2, transcript


# `extended` (16 s, a 7-s recording): CI has the gateway's captions in
# test_the_first_pause_shows_the_utterance_before_its_end_is_confirmed, and a pass's prefix
# kept by the served `asr` in tests/test_asr_triton.py::
# test_a_prefix_from_an_earlier_pass_gives_the_same_transcript
@pytest.mark.extended
def test_passes_while_speaking_leave_only_the_last_words_for_the_pause(gateway: str) -> None:
    """A 7-s human recording: the gateway transcribes the speech so far every second while
    it is spoken; the transcript at the pause starts from what two passes agreed on."""
    from evals.recordings import human_clips

    clip = max(human_clips(), key=lambda c: c.seconds)
    reply = asyncio.run(converse(_ws(gateway), clip.audio, controls={"seed": 3}))
    assert not reply.of("error"), reply.of("error")
    (start,) = reply.of("turn_start")
    assert start["speculative_asr"] is True and start["asr_prefix_tokens"] >= 5, start
    (transcript,) = reply.of("transcript")
    assert wer(clip.text, transcript["text"]) < 0.1, transcript
    # the passes were shown as live captions while the question was spoken, each over more
    # of it, before its turn; every word of each is in the question's text
    partials = [
        (m, reply.messages.index(m)) for m in reply.of("partial_transcript") if not m["at_pause"]
    ]
    assert len(partials) >= 3, reply.of("partial_transcript")
    heard = [m["audio_s"] for m, _ in partials]
    assert heard == sorted(heard) and heard[-1] < clip.seconds + 0.5, heard
    first_turn_message = reply.messages.index(start)
    assert all(i < first_turn_message and "turn" not in m for m, i in partials)
    words = set(_words(clip.text))
    for m, _ in partials:
        unknown = [w for w in _words(m["text"]) if w not in words]
        assert len(unknown) <= 2, (m["text"], unknown)  # a last word heard cut short


def _words(text: str) -> list[str]:
    return "".join(c if c.isalnum() or c == "'" else " " for c in text.lower()).split()


@pytest.fixture(scope="module")
def silence_gateway(triton_server) -> Iterator[str]:
    """A gateway whose turns end by silence alone (`--endpointing silence`)."""
    from gateway.process import running_gateway

    with running_gateway(triton_server.grpc_url, ["--endpointing", "silence"]) as (base, _):
        yield base


@pytest.fixture(scope="module")
def speculating_gateway(triton_server) -> Iterator[str]:
    """A gateway that also starts the reply at the first pause (`--speculate-turn`)."""
    from gateway.process import running_gateway

    # ended by silence: the questions' first halves are whole sentences, which the end-of-turn
    # model may end at a 0.4-s pause (see the discard test above)
    options = ["--speculate-turn", "--endpointing", "silence"]
    with running_gateway(triton_server.grpc_url, options) as (base, _process):
        yield base


def test_a_speculative_turn_is_held_until_the_end_of_speech(speculating_gateway: str) -> None:
    """The reply starts at the first pause, but nothing of it reaches the page before the
    end of speech is confirmed; then it arrives whole, on one clock, as a normal turn. At
    that pause (0.1 s) the page already gets the whole question as a caption, while the
    endpointer still waits, and the turn's transcript says the same. (A 1.5-s end of speech,
    so that a slow machine's ASR still finishes within it: the caption is sent only then.)"""
    clip = clips()[1]  # "What time does the museum open on Sunday?"
    controls = {"seed": 1, "end_silence_s": 1.5}
    reply = asyncio.run(converse(_ws(speculating_gateway), clip.audio, controls=controls))
    assert not reply.of("error"), reply.of("error")
    at_pause = [m for m in reply.of("partial_transcript") if m["at_pause"]]
    assert len(at_pause) == 1, reply.of("partial_transcript")
    (transcript,) = reply.of("transcript")
    assert at_pause[0]["text"] == transcript["text"]
    assert reply.at["partial_at_pause"] < reply.at["speech_end1"] < reply.at["transcript"]
    (start,) = reply.of("turn_start")
    assert start["speculative_turn"] is True and start["speculative_asr"] is True
    assert wer(clip.text, transcript["text"]) < 0.2
    (end,) = reply.of("turn_end")
    assert end["reply"] and end["cancelled"] == "" and end["turn"] == start["turn"]
    ended = reply.at["speech_end1"]
    turn_messages = [m for m in reply.messages if "turn" in m]
    assert reply.at["turn_start"] >= ended and min(reply.audio_arrived) > ended
    assert {m["turn"] for m in turn_messages} == {start["turn"]}
    sentences = reply.of("sentence")
    assert [a.sentence for a in reply.audio] == [s["index"] for s in sentences]


# CI: speculative turns in test_a_speculative_turn_is_held_until_the_end_of_speech
@pytest.mark.extended
def test_speech_after_a_pause_discards_the_speculative_turn(speculating_gateway: str) -> None:
    """0.4 s of silence inside a question: the turn started at the pause is cancelled when
    the speaker goes on; the page sees one turn, which heard both halves."""
    first, second = clips()[6], clips()[0]
    pause = np.zeros(int(0.4 * 16_000), np.float32)
    audio = np.concatenate([first.audio, pause, second.audio])
    reply = asyncio.run(converse(_ws(speculating_gateway), audio, controls={"seed": 2}))
    assert not reply.of("error"), reply.of("error")
    starts, ends = reply.of("turn_start"), reply.of("turn_end")
    assert len(starts) == 1 and len(ends) == 1 and ends[0]["cancelled"] == ""
    (transcript,) = reply.of("transcript")
    assert wer(f"{first.text} {second.text}", transcript["text"]) < 0.2, transcript
    assert {a.turn for a in reply.audio} == {starts[0]["turn"]}


def test_a_pause_the_words_hold_starts_the_reply_held_until_the_end_of_speech(
    gateway: str,
) -> None:
    """A head, "Can you tell me", and nothing more, to the default gateway: the words doubt
    the turn is over, so the pause is held (1.8 s), and the reply starts from the pause's
    transcript while it runs on, in a fork, held; when the hold ends the turn, the page gets
    the end of speech and then the reply, whole, as that turn's."""
    from evals.clips import synthesize

    audio = synthesize("Can you tell me", 1.0)
    reply = asyncio.run(converse(_ws(gateway), audio, controls={"seed": 4}))
    assert not reply.of("error"), reply.of("error")
    (ended,) = [m for m in reply.of("speech_end") if m.get("ended_by")]
    # held: the silence rule's 0.7 s would have ended it a second sooner
    assert ended["ended_by"] == "silence" and ended["utterance_s"] > len(audio) / 16_000 + 1.2
    (start,) = reply.of("turn_start")
    assert start["speculative_turn"] is True and start["speculative_asr"] is True, start
    assert reply.at["turn_start"] >= reply.at["speech_end1"]
    assert min(reply.audio_arrived) > reply.at["speech_end1"]
    (end,) = reply.of("turn_end")
    assert end["reply"] and end["cancelled"] == "" and end["turn"] == start["turn"]
    assert {a.turn for a in reply.audio} == {start["turn"]}
    assert reply.of("session"), "the conversation goes on in the confirmed fork"


def test_speech_after_a_held_pause_discards_the_reply_started_there(gateway: str) -> None:
    """A head, 1 s of silence, the rest ("Can you tell me" ... "where the nearest train
    station is"): the reply started at the held pause is discarded when the speaker goes
    on; the page sees one turn (its number after the discarded one's), which heard both
    halves."""
    from evals.clips import synthesize

    head, rest = "Can you tell me", "where the nearest train station is?"
    pause = np.zeros(16_000, np.float32)
    audio = np.concatenate([synthesize(head, 1.0), pause, synthesize(rest, 1.0)])
    reply = asyncio.run(converse(_ws(gateway), audio, controls={"seed": 5}))
    assert not reply.of("error"), reply.of("error")
    starts, ends = reply.of("turn_start"), reply.of("turn_end")
    assert len(starts) == 1 and len(ends) == 1 and ends[0]["cancelled"] == "", (starts, ends)
    assert starts[0]["turn"] >= 2, "no reply was started at the held pause"
    (transcript,) = reply.of("transcript")
    assert wer(f"{head} {rest}", transcript["text"]) < 0.25, transcript
    assert {a.turn for a in reply.audio} == {starts[0]["turn"]}


def test_barge_in_stops_the_reply_and_the_next_turn_answers(gateway: str) -> None:
    """Speaking over the avatar: the page is told to stop at once, the turn is cancelled on
    the server, and the new question gets its own answer. The first question asks for a
    reply long enough to be still running when the second is spoken (a one-sentence reply
    ends on the server before the barge-in: nothing left to cancel)."""
    first, second = clips()[18], clips()[12]
    reply = asyncio.run(converse(_ws(gateway), first.audio, barge_in=second.audio))
    (interrupt,) = reply.of("interrupt")
    assert interrupt == {"type": "interrupt", "turn": 1, "reason": "barge-in"}
    ends = reply.of("turn_end")
    assert [e["turn"] for e in ends] == [1, 2]
    assert ends[0]["cancelled"] == "barge-in" and ends[1]["cancelled"] == ""
    late = [
        t for a, t in zip(reply.audio, reply.audio_arrived, strict=True)
        if a.turn == 1 and t > reply.at["interrupt"]
    ]  # fmt: skip
    assert not late, "audio of the interrupted turn after the stop message"
    transcripts = [t["text"] for t in reply.of("transcript")]
    assert wer(second.text, transcripts[-1]) < 0.2
    # from the first speech frame over the reply to the stop message (CPU, shared machine)
    assert reply.at["interrupt"] - reply.at["barge_in_first_sent"] < 2.0


def test_bad_messages_get_errors_and_the_connection_keeps_serving(gateway: str) -> None:
    import aiohttp

    async def session() -> list[dict]:
        got = []
        async with aiohttp.ClientSession() as http, http.ws_connect(_ws(gateway)) as ws:
            assert (await ws.receive_json())["type"] == "ready"
            for bad in ["not json", json.dumps([1]), json.dumps({"type": "dance"})]:
                await ws.send_str(bad)
                got.append(await ws.receive_json())
            for bad in [b"\x07abc", b"\x01\x00"]:
                await ws.send_bytes(bad)
                got.append(await ws.receive_json())
            await ws.send_json({"type": "controls", "controls": {"fps": "fast"}})
            got.append(await ws.receive_json())
            await ws.send_json({"type": "text", "text": ""})
            got.append(await ws.receive_json())
            await ws.send_json({"type": "text", "text": "Say hello."})
            while True:
                frame = await ws.receive()
                if frame.type == aiohttp.WSMsgType.BINARY:  # the reply's audio and frames
                    continue
                got.append(json.loads(frame.data))
                if got[-1]["type"] == "turn_end":
                    break
        return got

    got = asyncio.run(session())
    errors = [m["message"] for m in got if m["type"] == "error"]
    assert len(errors) == 7, errors
    assert {m["code"] for m in got if m["type"] == "error"} == {"bad_request"}
    for message, needle in zip(
        errors,
        ["not JSON", "JSON object", "unknown message type 'dance'", "kind 0x07", "even count",
         "fps", "non-empty"],
        strict=True,
    ):  # fmt: skip
        assert needle in message, message
    assert got[-1]["type"] == "turn_end" and got[-1]["reply"] and not got[-1]["errors"]


def test_avatar_serve_web_passes_host_key_tls_and_session_secret_to_the_gateway(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`avatar serve --web --api-key ...` works: the key and the session secret reach the
    gateway child through its environment (argv shows in `ps`), TLS as the CA it trusts."""
    import contextlib

    from gateway import process
    from serving import cli
    from serving.server import ServerOptions

    started: list[dict] = []

    @contextlib.contextmanager
    def running_gateway(url, options=(), *, port=None, env=None, **_):
        started.append({"url": url, "options": list(options), "env": dict(env or {})})
        yield "http://127.0.0.1:1", None

    monkeypatch.setattr(process, "running_gateway", running_gateway)
    monkeypatch.delenv("AVATAR_SESSION_SECRET", raising=False)
    monkeypatch.delenv("AVATAR_SESSION_SECRET_FILE", raising=False)
    secret = cli._session_secret()
    assert len(secret) == 64 and secret != cli._session_secret()  # random per run
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    options = ServerOptions(
        tmp_path,
        host="0.0.0.0",
        api_key="s3cret-key",
        tls_cert=cert,
        tls_key=key,
        session_secret=secret,
    )
    with cli._gateway("localhost:8001", 8080, options):
        pass
    (run,) = started
    argv = " ".join(run["options"])
    assert "s3cret-key" not in argv and secret not in argv
    assert run["env"] == {"AVATAR_API_KEY": "s3cret-key", "AVATAR_SESSION_SECRET": secret}
    assert f"--host 0.0.0.0 --triton-key-header {options.key_header}" in argv
    assert f"--triton-ca {cert}" in argv and f"--tls-cert {cert} --tls-key {key}" in argv
    seen: list = []
    monkeypatch.setattr(cli, "_serve", lambda args: seen.append(args) or 0)
    assert cli.main(["serve", "--web"]) == 0 and seen[0].host == "127.0.0.1"  # loopback
