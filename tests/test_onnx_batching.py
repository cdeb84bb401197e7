"""The generic runner's batching and per-request errors, without a server."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from google.protobuf import json_format

from avatar.errors import RequestError
from avatar.onnx_batching import BatchedSession
from model_configs.pbtxt import SOURCE_REPOSITORY, parse_config
from serving.repository import embedded_config


def _session(vad_artifact: Path) -> BatchedSession:
    config = embedded_config(parse_config(SOURCE_REPOSITORY / "vad" / "config.pbtxt"))
    as_json = json.loads(json_format.MessageToJson(config, preserving_proto_field_name=True))
    return BatchedSession.from_config(vad_artifact / "model.onnx", as_json)


def _request(rng: np.random.Generator, batch: int = 1) -> dict[str, np.ndarray]:
    return {
        "chunk": rng.normal(0, 0.1, (batch, 512)).astype(np.float32),
        "context": rng.normal(0, 0.1, (batch, 64)).astype(np.float32),
        "state": rng.normal(0, 0.1, (batch, 2, 128)).astype(np.float32),
    }


def test_batched_results_equal_single_runs(vad_artifact: Path) -> None:
    session = _session(vad_artifact)
    rng = np.random.default_rng(0)
    requests = [_request(rng, batch) for batch in (1, 3, 1, 2)]
    batched = session.run(requests)
    for request, result in zip(requests, batched, strict=True):
        alone = session.run([request])[0]
        assert isinstance(result, dict) and isinstance(alone, dict)
        assert result["speech_prob"].shape == (request["chunk"].shape[0], 1)
        for name in alone:
            np.testing.assert_allclose(result[name], alone[name], atol=1e-6)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (
            lambda r: r.update(chunk=r["chunk"].astype(np.float64)),
            "dtype float64, expected float32",
        ),
        (
            lambda r: r.update(chunk=r["chunk"][:, :100]),
            r"shape \[1, 100\], expected \['batch', 512\]",
        ),
        (lambda r: r["chunk"].__setitem__((0, 5), np.nan), "NaN or Inf"),
        (lambda r: r.pop("state"), "missing input 'state'"),
        (lambda r: r.update(state=np.zeros((2, 2, 128), np.float32)), "disagree on the batch size"),
    ],
)
def test_a_bad_request_fails_alone(vad_artifact: Path, mutate, message: str) -> None:
    session = _session(vad_artifact)
    rng = np.random.default_rng(1)
    good, bad, also_good = _request(rng), _request(rng), _request(rng)
    mutate(bad)
    results = session.run([good, bad, also_good])
    assert isinstance(results[1], RequestError)
    assert re.search(message, str(results[1])), str(results[1])
    for ok in (results[0], results[2]):
        assert isinstance(ok, dict) and ok["speech_prob"].shape == (1, 1)
