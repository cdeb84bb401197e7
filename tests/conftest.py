"""Shared fixtures: the artifacts, a materialised embedded repository, one real tritonserver.

The server is started once per test session on free ports with every model of
`model_repository/`, and is always stopped.
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
