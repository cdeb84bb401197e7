"""A real RTMP server for the broadcast's tests (serving.local_services.running_rtmp_server:
nginx with Debian's `libnginx-mod-rtmp` on a free loopback port). `rtmp_server` is the
pytest fixture (import it into a test file)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest

from serving.local_services import RTMP_MODULE, RtmpServer, running_rtmp_server
from serving.server import free_port

__all__ = ["RtmpServer", "free_port", "rtmp_server", "running_rtmp_server"]


@pytest.fixture()
def rtmp_server() -> Iterator[RtmpServer]:
    """A real nginx-rtmp server of its own for one test."""
    if not RTMP_MODULE.exists() or shutil.which("nginx") is None:
        pytest.skip("nginx with libnginx-mod-rtmp is not installed (scripts/setup.sh --tests)")
    with running_rtmp_server() as server:
        yield server
