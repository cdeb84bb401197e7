"""Shared fixtures: the artifacts, a materialised embedded repository, one real tritonserver.

The server is started once per test session on free ports with every model of
`model_repository/`, and is always stopped. Modules that need another configuration (a key,
a secret, fewer models, limits) or that kill their server start one of their own.

`make test` runs the suite in two processes at once: the tests of UNTIMED_MODULES in a
second one at idle priority (SCHED_IDLE, nice 19), so that they use the CPU the others leave
idle (those wait on real servers, browsers and audio at its own pace) without delaying
them; `make test TEST_LANES=1` runs it in one.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from serving.deployment import build_repository
from serving.server import EmbeddedServer, ServerOptions

logging.getLogger("avatar").setLevel(logging.INFO)

# Modules whose models run in the test's own process, with no server of any kind and no
# deadline or wall-clock figure: starved of CPU they only take longer. Marked `untimed` here
# (a test in another module may carry the mark itself).
# A module with a server, a timeout or a timing assertion stays out (the default).
UNTIMED_MODULES = frozenset(
    {
        "test_animation", "test_asr_core", "test_asr_degenerate", "test_asr_engine",
        "test_asr_export", "test_asr_prefix", "test_asr_tiny", "test_bls_memory",
        "test_emotion_classifier", "test_emotion_hold", "test_engines", "test_gates",
        "test_gpu_stages", "test_grounding", "test_imports", "test_knowledge", "test_lipsync",
        "test_llm_core", "test_llm_engine", "test_llm_export", "test_llm_tensorrt",
        "test_llm_tensorrt_backend", "test_model_io", "test_onnx_batching", "test_persona",
        "test_perf_gpu_capacity", "test_pipeline_speech", "test_portrait", "test_renderer",
        "test_reply_text", "test_repository", "test_tts_synth", "test_tts_text",
        "test_turn_taking_eval", "test_gateway_endpointing",
    }
)  # fmt: skip


# a test that asks for one of these has a server with a deadline after all (a Redis call
# times out in 0.5 s): it stays with the timed tests whatever its module
SERVER_FIXTURES = frozenset({"triton_server", "gateway", "redis_url"})


@pytest.hookimpl(tryfirst=True)  # before `-m` selects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        servers = SERVER_FIXTURES.intersection(getattr(item, "fixturenames", ()))
        if item.path.stem in UNTIMED_MODULES and not servers:
            item.add_marker(pytest.mark.untimed)


@pytest.fixture(scope="session")
def embedded_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("embedded") / "repository"
    build_repository(repo, "embedded")
    return repo


@pytest.fixture(scope="session")
def triton_server(embedded_repository: Path) -> Iterator[EmbeddedServer]:
    with EmbeddedServer(ServerOptions(embedded_repository, startup_timeout_s=600)) as server:
        yield server
    # Models that crashed their stub or leaked errors show up here after the run.
    logging.getLogger(__name__).info("server log: %s", server.log_path)


@pytest.fixture(scope="session")
def vad_artifact() -> Path:
    from export.registry import ensure_all

    return ensure_all(["vad"])["vad"]


@pytest.fixture(scope="session")
def gateway(triton_server: EmbeddedServer) -> Iterator[str]:
    """The gateway's base URL (http://127.0.0.1:PORT), once `/healthz` says ready."""
    from gateway.process import running_gateway

    with running_gateway(triton_server.grpc_url) as (base, _process):
        yield base


@pytest.fixture()
def redis_url() -> Iterator[str]:
    """A real redis-server of its own on a free loopback port; its URL."""
    from serving.local_services import running_redis

    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed (scripts/setup.sh --tests installs it)")
    with running_redis() as url:
        yield url
