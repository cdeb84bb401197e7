"""Deployment files, validated offline: docker-compose.yml against the Compose
Specification's JSON schema (no container engine, no Compose client) and by structure;
deploy/k8s/ by kubernetes-validate's bundled schemas (strict) and by structure. Nothing
here starts a container or a cluster."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from serving.deployment import PROJECT_ROOT

COMPOSE = PROJECT_ROOT / "docker-compose.yml"
DOCKERFILE = PROJECT_ROOT / "docker" / "Dockerfile"
K8S = PROJECT_ROOT / "deploy" / "k8s"
KUBERNETES_VERSION = "1.31.0"  # schemas bundled with kubernetes-validate (no network)
# Documents that have no schema in Kubernetes itself, and why they are only parsed.
NOT_SCHEMA_CHECKED = {
    "ServiceMonitor": "Prometheus Operator CRD (monitoring.coreos.com/v1): no bundled schema",
    "Kustomization": "a kustomize file, not an object of the Kubernetes API",
}
COMPOSE_SCHEMA = Path(__file__).parent / "data" / "compose_spec.json"


def _compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


def _documents() -> list[tuple[str, dict[str, Any]]]:
    docs = []
    for path in sorted(K8S.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            assert isinstance(doc, dict) and "kind" in doc, f"{path.name}: not an object"
            name = doc.get("metadata", {}).get("name", "-")
            docs.append((f"{path.name}:{doc['kind']}:{name}", doc))
    return docs


DOCUMENTS = _documents() if K8S.is_dir() else []


def _one(kind: str, name: str) -> dict[str, Any]:
    (doc,) = [d for _, d in DOCUMENTS if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


# ------------------------------------------------------------------ docker-compose


def _compose_errors(text: str) -> list[str]:
    """Violations of the Compose Specification's JSON schema (tests/data/README.md)."""
    import jsonschema

    schema = json.loads(COMPOSE_SCHEMA.read_text())
    validator = jsonschema.Draft7Validator(schema)
    return [
        f"{'/'.join(map(str, e.path))}: {e.message}"
        for e in validator.iter_errors(yaml.safe_load(text))
    ]


def test_compose_file_follows_the_compose_specification() -> None:
    assert _compose_errors(COMPOSE.read_text()) == []
    # the same check rejects a misspelt key (so it is not a no-op)
    errors = _compose_errors(COMPOSE.read_text().replace("shm_size:", "shm_sizes:"))
    assert any("shm_sizes" in e for e in errors), errors


def test_compose_structure() -> None:
    compose = _compose()
    services = compose["services"]
    assert set(services) == {"engines", "triton", "gateway"}
    engines, triton = services["engines"], services["triton"]
    for service in (engines, triton):
        (device,) = service["deploy"]["resources"]["reservations"]["devices"]
        assert device["driver"] == "nvidia" and "gpu" in device["capabilities"]
        assert "artifacts:/cache" in service["volumes"]
        assert service["build"]["dockerfile"] == "docker/Dockerfile"
    assert "artifacts" in compose["volumes"], "the artifact cache is a named volume"

    command = " ".join(engines["command"])
    assert (
        "python3 -m export engines &&" in command
        and "python3 -m serving materialize --target production --out /cache/repository-production"
        in command
    )
    assert triton["depends_on"]["engines"]["condition"] == "service_completed_successfully"
    assert "--model-repository=/cache/repository-production" in triton["command"]
    assert {p.split(":")[0] for p in triton["ports"]} == {"8000", "8001", "8002"}
    assert triton["shm_size"]
    assert "localhost:8000/v2/health/ready" in " ".join(triton["healthcheck"]["test"])
    gateway = services["gateway"]  # no GPU, waits for a healthy Triton, reached on :8080
    assert "deploy" not in gateway
    assert gateway["depends_on"]["triton"]["condition"] == "service_healthy"
    assert gateway["command"][3:5] == ["--triton-url", "triton:8001"]
    assert "localhost:8080/healthz" in " ".join(gateway["healthcheck"]["test"])


def test_dockerfile_stages_match_compose() -> None:
    text = DOCKERFILE.read_text()
    tag = re.search(r"^ARG NGC_TAG=(\S+)$", text, re.MULTILINE).group(1)
    stages = {
        name: image.replace("${NGC_TAG}", tag)
        for image, name in re.findall(r"^FROM (\S+) AS (\w+)$", text, re.MULTILINE)
    }
    assert stages == {
        "engines": "nvcr.io/nvidia/tensorrt:24.10-py3",
        "server": "nvcr.io/nvidia/tritonserver:24.10-py3",
        "gateway": "python:3.11-slim",
    }
    targets = {s["build"]["target"] for s in _compose()["services"].values()}
    assert targets == set(stages)
    assert 'pip install --no-cache-dir -e ".[serve,models]"' in text, "BLS models import avatar"


# ------------------------------------------------------------------ Kubernetes


def test_every_manifest_parses_and_kustomization_lists_them() -> None:
    assert DOCUMENTS, "deploy/k8s has manifests"
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    files = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kustomization["resources"]) == files


@pytest.mark.parametrize(("label", "doc"), DOCUMENTS, ids=[label for label, _ in DOCUMENTS])
def test_manifest_validates_against_kubernetes_schema(label: str, doc: dict[str, Any]) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    if doc["kind"] in NOT_SCHEMA_CHECKED:
        pytest.skip(NOT_SCHEMA_CHECKED[doc["kind"]])
    kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_schema_validation_rejects_a_typo() -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    doc = _one("Deployment", "triton-avatar")
    broken = yaml.safe_load(yaml.safe_dump(doc))
    broken["spec"]["template"]["spec"]["containers"][0]["readynessProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError, match="readynessProbe"):
        kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)


def test_triton_deployment() -> None:
    deployment = _one("Deployment", "triton-avatar")
    assert deployment["spec"]["replicas"] >= 2
    pod = deployment["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert container["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http": 8000, "grpc": 8001, "metrics": 8002}
    assert pod["metadata"]["annotations"]["prometheus.io/port"] == "8002"
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts == {"artifacts": "/cache", "dshm": "/dev/shm"}
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["dshm"]["emptyDir"]["medium"] == "Memory"
    assert volumes["artifacts"]["persistentVolumeClaim"]["claimName"] == "avatar-artifacts"
    (wait,) = pod["spec"]["initContainers"]
    job = _one("Job", "avatar-engines")
    assert "/cache/engines-complete" in " ".join(wait["args"])
    (builder,) = job["spec"]["template"]["spec"]["containers"]
    script = " ".join(builder["args"])
    assert (
        "python3 -m export engines &&" in script
        and "python3 -m serving materialize --target production --out /cache/repository-production"
        in script
    )
    assert script.rstrip().endswith("/cache/engines-complete"), "marker written last"
    assert builder["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert "--model-repository=/cache/repository-production" in container["args"]
    claim = _one("PersistentVolumeClaim", "avatar-artifacts")
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]


def test_envoy_balances_grpc_by_session() -> None:
    config = yaml.safe_load(_one("ConfigMap", "avatar-envoy-config")["data"]["envoy.yaml"])
    resources = config["static_resources"]
    clusters = {c["name"]: c for c in resources["clusters"]}
    grpc = clusters["triton_grpc"]
    assert grpc["lb_policy"] == "RING_HASH" and grpc["type"] == "STRICT_DNS"
    options = grpc["typed_extension_protocol_options"][
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
    ]
    assert "http2_protocol_options" in options["explicit_http_config"], "gRPC is HTTP/2"
    (endpoint,) = grpc["load_assignment"]["endpoints"][0]["lb_endpoints"]
    headless = _one("Service", endpoint["endpoint"]["address"]["socket_address"]["address"])
    assert headless["spec"]["clusterIP"] == "None", "per-pod addresses for hashing"
    assert grpc["health_checks"][0]["http_health_check"]["path"] == "/v2/health/ready"

    listeners = {item["name"]: item for item in resources["listeners"]}
    manager = listeners["grpc"]["filter_chains"][0]["filters"][0]["typed_config"]
    assert manager["codec_type"] == "HTTP2"
    (route,) = manager["route_config"]["virtual_hosts"][0]["routes"]
    assert route["route"]["cluster"] == "triton_grpc"
    assert route["route"]["hash_policy"][0] == {"header": {"header_name": "session-id"}}

    entry = _one("Service", "triton-avatar")
    ports = {p["name"]: p["port"] for p in entry["spec"]["ports"]}
    assert ports == {"grpc": 8001, "http": 8000}
    balancer = _one("Deployment", "avatar-envoy")["spec"]["template"]["metadata"]["labels"]
    assert all(balancer[k] == v for k, v in entry["spec"]["selector"].items())


def test_prometheus_scrapes_triton_metrics() -> None:
    monitor = _one("ServiceMonitor", "triton-avatar")
    service = _one("Service", "triton-avatar-metrics")
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert all(service["metadata"]["labels"][k] == v for k, v in selector.items())
    (endpoint,) = monitor["spec"]["endpoints"]
    (port,) = service["spec"]["ports"]
    assert endpoint["port"] == port["name"] and port["port"] == 8002
    config = yaml.safe_load(_one("ConfigMap", "avatar-prometheus-config")["data"]["prometheus.yml"])
    (job,) = config["scrape_configs"]
    keep = job["relabel_configs"][0]
    assert keep["action"] == "keep"
    assert keep["source_labels"] == ["__meta_kubernetes_pod_annotation_prometheus_io_scrape"]


def test_accelerator_cache_folders_are_created_by_the_engine_jobs() -> None:
    """ONNX Runtime creates only the last folder of trt_engine_cache_path: both engine jobs
    make each configured path beforehand, on the volume the servers mount at /cache."""
    from avatar.model_config import SOURCE_REPOSITORY, parse_config

    paths = []
    for config_path in sorted(SOURCE_REPOSITORY.glob("*/config.pbtxt")):
        accelerators = parse_config(
            config_path
        ).optimization.execution_accelerators.gpu_execution_accelerator
        paths += [a.parameters["trt_engine_cache_path"] for a in accelerators]
    assert paths, "tts_vits uses ONNX Runtime's TensorRT accelerator"
    compose = " ".join(_compose()["services"]["engines"]["command"])
    (job,) = _one("Job", "avatar-engines")["spec"]["template"]["spec"]["containers"]
    for path in paths:
        assert path.startswith("/cache/")
        made = rf"mkdir -p [^&]*{re.escape(path)}\b"
        assert re.search(made, compose) and re.search(made, " ".join(job["args"])), path
