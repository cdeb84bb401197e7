"""Overload on a real embedded tritonserver with small limits: the `avatar` admission limit
(max_active_turns) and the `asr` queue policy refuse extra work at once with a clear
"busy"/"queue" error while the admitted requests are served. The 4x-capacity figures
(refusal time, admitted p50/p99 against 1x) come from `python -m perf.overload`."""

from __future__ import annotations

import concurrent.futures
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from grpc_calls import call, strings

from perf import probe
from serving.deployment import build_repository
from serving.server import EmbeddedServer, ServerOptions

pytestmark = pytest.mark.server
AVATAR_MODELS = ["avatar", "emotion_encoder", "llm", "llm_decoder", "tts", "tts_vits"]
ASR_MODELS = ["asr", "asr_encoder", "asr_decoder"]


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedServer]:
    """One avatar turn at a time (text turns: no asr)."""
    repo: Path = tmp_path_factory.mktemp("overload") / "repository"
    build_repository(repo, "embedded", AVATAR_MODELS)
    probe.set_parameters(repo, "avatar", max_active_turns="1")
    with EmbeddedServer(ServerOptions(repo, startup_timeout_s=600)) as server:
        yield server


@pytest.fixture(scope="module")
def small_asr(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedServer]:
    """asr queues at most 2 requests besides the batch it runs."""
    repo: Path = tmp_path_factory.mktemp("overload-asr") / "repository"
    build_repository(repo, "embedded", ASR_MODELS)
    probe.set_queue_policy(repo, "asr", max_queue_size=2, timeout_us=30_000_000)
    with EmbeddedServer(ServerOptions(repo, startup_timeout_s=600)) as server:
        yield server


def _together(count: int, fn) -> list:
    with concurrent.futures.ThreadPoolExecutor(count) as pool:
        return list(pool.map(fn, range(count)))


def test_turns_beyond_the_admission_limit_are_refused_at_once(small):
    turn = {"text": strings("Tell me about the hotel."), "controls": strings('{"max_tokens": 16}')}
    replies = _together(4, lambda _: call(small.grpc_url, "avatar", turn, timeout_s=300))
    refused = [r for r in replies if r.error is not None]
    served = [r for r in replies if r.error is None]
    assert len(served) >= 1 and len(refused) >= 2, [r.error for r in replies]
    for reply in refused:
        assert "server busy" in reply.error and "max_active_turns" in reply.error, reply.error
        assert reply.seconds < 2.0, f"refused only after {reply.seconds:.2f} s"
    for reply in served:
        final = reply.responses[-1]
        assert final["kind"].reshape(-1)[0] == b"final"
        assert json.loads(final["error"].reshape(-1)[0]) == []
        assert reply.seconds > max(r.seconds for r in refused)
    values = probe.metrics(small.metrics_url)
    assert probe.refused(values, "avatar") == len(refused)
    assert probe.gauge(values, "avatar", "turns") == 0


@pytest.mark.slow
def test_asr_requests_beyond_its_queue_are_refused_at_once(small_asr):
    from avatar.audio import reference_speech

    url = small_asr.grpc_url
    audio = reference_speech("Where is the lobby?")[None]
    replies = _together(24, lambda _: call(url, "asr", {"audio": audio}))
    refused = [r for r in replies if r.error is not None]
    served = [r for r in replies if r.error is None]
    assert refused and served, [r.error for r in replies]
    for reply in refused:
        assert "exceeds maximum queue size" in reply.error.lower(), reply.error
    slowest_refusal = max(r.seconds for r in refused)
    assert slowest_refusal < min(r.seconds for r in served), "refusals come before answers"
    assert all("lobby" in r.text("text").lower() for r in served)
    # the service is whole afterwards: one request alone is served
    assert call(url, "asr", {"audio": audio}).error is None
