"""Access control on a real embedded tritonserver: an API key on the inference and
model-repository protocols (Triton's restricted protocols, gRPC and HTTP) and gRPC over
TLS with a self-signed certificate made here by openssl."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from grpc_calls import call

from serving.deployment import build_repository
from serving.server import EmbeddedServer, ServerError, ServerOptions

pytestmark = pytest.mark.server
KEY = "s3cret-key-for-tests"
VAD = {
    "chunk": np.zeros((1, 512), np.float32),
    "context": np.zeros((1, 64), np.float32),
    "state": np.zeros((1, 2, 128), np.float32),
}


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-keyout", str(key), "-out", str(cert), "-subj", "/CN=localhost",
         "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
        check=True, capture_output=True,
    )  # fmt: skip
    return cert, key


@pytest.fixture(scope="module")
def secured(tmp_path_factory, certificate) -> Iterator[EmbeddedServer]:
    """vad only (explicit model control), the key on inference + model-repository, TLS."""
    repo = tmp_path_factory.mktemp("secured") / "repository"
    build_repository(repo, "embedded", ["vad"])
    cert, key = certificate
    options = ServerOptions(repo, models=("vad",), api_key=KEY, tls_cert=cert, tls_key=key)
    with EmbeddedServer(options) as server:
        yield server


@pytest.fixture(scope="module")
def tls(certificate) -> dict:
    return {"ssl": True, "root_certificates": str(certificate[0])}


def test_inference_without_the_key_is_refused_with_it_served(secured, tls):
    refused = call(secured.grpc_url, "vad", VAD, ssl=tls)
    assert refused.error is not None and "restricted" in refused.error.lower(), refused.error
    header = next(iter(secured.options.grpc_headers))
    wrong = call(secured.grpc_url, "vad", VAD, ssl=tls, headers={header: "not-the-key"})
    assert wrong.error is not None and "restricted" in wrong.error.lower(), wrong.error
    served = call(secured.grpc_url, "vad", VAD, ssl=tls, headers=secured.options.grpc_headers)
    assert served.error is None and served.responses[0]["speech_prob"].shape == (1, 1)


def test_model_control_needs_the_key(secured, tls):
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    with grpcclient.InferenceServerClient(secured.grpc_url, **tls) as client:
        with pytest.raises(InferenceServerException, match=r"(?i)restricted"):
            client.unload_model("vad")
        with pytest.raises(InferenceServerException, match=r"(?i)restricted"):
            client.get_model_repository_index()
        assert client.is_model_ready("vad")  # the refused unload did nothing
        key = secured.options.grpc_headers
        client.load_model("vad", headers=key)  # a reload: allowed with the key
        index = client.get_model_repository_index(headers=key, as_json=True)
        assert [m["name"] for m in index["models"]] == ["vad"]
        assert client.is_server_ready()  # health stays open for probes


def test_plain_grpc_client_cannot_talk_to_the_tls_port(secured):
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    with (
        grpcclient.InferenceServerClient(secured.grpc_url) as client,
        pytest.raises(InferenceServerException),
    ):
        client.is_server_live(client_timeout=5)


def test_http_inference_needs_the_key(secured):
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    with httpclient.InferenceServerClient(secured.http_url) as client:
        inputs = []
        for name, value in VAD.items():
            tensor = httpclient.InferInput(name, list(value.shape), "FP32")
            tensor.set_data_from_numpy(value)
            inputs.append(tensor)
        with pytest.raises(InferenceServerException, match=r"(?i)restricted|unauthori"):
            client.infer("vad", inputs)
        result = client.infer("vad", inputs, headers=secured.options.headers)
        assert result.as_numpy("speech_prob").shape == (1, 1)


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"restricted": ("inference", "everything")}, "restricted protocols"),
        ({"key_header": "a:b"}, "key header"),
        ({"api_key": "a,b"}, "commas"),
        ({"tls_cert": Path("cert.pem")}, "both tls_cert and tls_key"),
    ],
)
def test_bad_access_options_are_refused_before_starting(tmp_path, changes, words):
    options = ServerOptions(tmp_path, **{"api_key": "k", **changes})
    with pytest.raises(ServerError, match=words):
        options.access_args()
