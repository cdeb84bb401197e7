"""`perf.soak`'s own checks, on real processes: a stub process that vanishes is noticed
and named, and the report's exit status says the soak failed."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time

import pytest

from perf import probe
from perf.soak import SoakRun, Watch, report

# A parent with two children whose command lines name a model.py, as tritonserver's stubs
CHILD = "import time; time.sleep(60)"
PARENT = f"""
import subprocess, sys, time
kids = [subprocess.Popen([sys.executable, "-c", {CHILD!r}, f"/repo/{{m}}/1/model.py"])
        for m in ("avatar", "tts")]
time.sleep(60)
"""


@pytest.fixture
def fake_server():
    parent = subprocess.Popen([sys.executable, "-c", PARENT])
    deadline = time.monotonic() + 20
    while len(probe.stub_pids(parent.pid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    yield parent
    for pid in probe.stub_pids(parent.pid).values():
        os.kill(pid, signal.SIGKILL)
    parent.kill()
    parent.wait()


def _args(**overrides) -> argparse.Namespace:
    values = {"minutes": 1.0, "clients": 3, "turn_timeout_s": 120.0, "sample_s": 10.0, "out": None}
    return argparse.Namespace(**{**values, **overrides})


def test_watch_names_a_stub_that_vanished(fake_server):
    watch = Watch(lambda: fake_server.pid, every_s=10.0)
    watch.sample()
    assert watch.deaths == []
    victim = probe.stub_pids(fake_server.pid)["avatar"]
    os.kill(victim, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while "avatar" in probe.stub_pids(fake_server.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    watch.sample()
    assert [(d["model"], d["pid"]) for d in watch.deaths] == [("avatar", victim)]
    watch.sample()  # noticed once
    assert len(watch.deaths) == 1


def test_report_fails_on_a_vanished_stub_a_stuck_turn_or_an_interrupt(fake_server, tmp_path):
    served = probe.Outcome(started=0.0, seconds=3.0, error="", refused=False, first_audio_s=1.0)
    stuck = probe.Outcome(0.0, 120.0, "avatar: no response for 60 s; stream cancelled", False)
    watch = Watch(lambda: fake_server.pid, every_s=10.0)
    watch.sample()
    clean = SoakRun(outcomes=[served], watch=watch, alive=True)
    assert report(_args(out=tmp_path / "soak.json"), clean) == 0
    assert (tmp_path / "soak.json").is_file()
    assert report(_args(), SoakRun(outcomes=[served, stuck], watch=watch, alive=True)) == 1
    assert report(_args(), SoakRun([served], watch, alive=True, interrupted=True)) == 1
    watch.deaths.append({"model": "avatar", "pid": 1, "last_seen_s": 5.0, "noticed_s": 15.0})
    assert report(_args(), SoakRun(outcomes=[served], watch=watch, alive=True)) == 1
