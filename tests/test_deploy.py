"""Deployment files, validated offline: docker-compose.yml against the Compose
Specification's JSON schema (no container engine, no Compose client) and by structure;
deploy/k8s/ by kubernetes-validate's bundled schemas (strict), by `kubectl kustomize` where
kubectl is installed, and by structure; deploy/haproxy/haproxy.cfg by `haproxy -c` and by a
real run in front of two gRPC backends on this machine. Nothing here starts a container or
a cluster."""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from concurrent import futures
from pathlib import Path
from typing import Any

import pytest
import yaml

from serving.deployment import PROJECT_ROOT
from serving.local_services import environment, local_config, running_haproxy

COMPOSE = PROJECT_ROOT / "docker-compose.yml"
DOCKERFILE = PROJECT_ROOT / "docker" / "Dockerfile"
K8S = PROJECT_ROOT / "deploy" / "k8s"
HAPROXY_DIR = PROJECT_ROOT / "deploy" / "haproxy"
HAPROXY_CFG = HAPROXY_DIR / "haproxy.cfg"
KEY_ENVS = ("AVATAR_SESSION_SECRET", "AVATAR_API_KEY", "AVATAR_GATEWAY_KEY")
POD_KINDS = ("Deployment", "StatefulSet", "Job")
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
    assert set(services) == {"engines", "triton", "haproxy", "redis", "gateway"}
    engines, triton = services["engines"], services["triton"]
    for service in (engines, triton):
        (device,) = service["deploy"]["resources"]["reservations"]["devices"]
        assert device["driver"] == "nvidia" and "gpu" in device["capabilities"]
        assert service["build"]["dockerfile"] == "docker/Dockerfile"
    assert "artifacts:/cache" in engines["volumes"]
    assert "artifacts" in compose["volumes"], "the artifact cache is a named volume"

    command = " ".join(engines["command"])
    assert (
        "python3 -m export engines &&" in command
        and "python3 -m serving materialize --target production --out /cache/repository-production"
        in command
    )
    assert triton["depends_on"]["engines"]["condition"] == "service_completed_successfully"
    assert "--model-repository=/cache/repository-production" in triton["command"]
    assert triton["deploy"]["replicas"] >= 2
    assert triton["shm_size"]
    assert triton["healthcheck"]["test"][1:] == ["python3", "-m", "serving.health", "--check"]
    assert triton["environment"]["AVATAR_REDIS_URL"] == "redis://redis:6379/0"
    assert triton["environment"]["AVATAR_HEALTH_RESTART_AFTER"], "compose heals a dead stub"
    gateway = services["gateway"]  # no GPU, reaches Triton through HAProxy, reached on :8443
    assert "deploy" not in gateway
    assert gateway["command"][3:5] == ["--triton-url", "haproxy:8001"]
    assert "localhost:8443/healthz" in " ".join(gateway["healthcheck"]["test"])


def test_compose_publishes_only_the_gateway_over_tls() -> None:
    compose = _compose()
    services = compose["services"]
    published = {name for name, s in services.items() if s.get("ports")}
    assert published == {"gateway"}, "Triton, HAProxy and Redis stay internal"
    gateway = services["gateway"]
    (port,) = gateway["ports"]
    command = gateway["command"]
    assert port.split(":")[-1] == command[command.index("--port") + 1]
    for flag in ("--tls-cert", "--tls-key"):
        path = command[command.index(flag) + 1]
        assert path.startswith("/run/secrets/") and path.rsplit("/", 1)[1] in gateway["secrets"]
    assert compose["networks"]["internal"]["internal"] is True
    for name in ("engines", "triton", "haproxy", "redis"):
        assert services[name]["networks"] == ["internal"], name
    haproxy = services["haproxy"]
    assert (
        "./deploy/haproxy/haproxy.cfg:/usr/local/etc/haproxy/haproxy.cfg:ro" in haproxy["volumes"]
    )
    assert haproxy["environment"]["TRITON_GRPC"] == "triton:8001"
    redis = services["redis"]
    assert redis["image"].startswith("redis:7") and "--appendonly" in redis["command"]


def test_compose_runs_no_container_as_root_and_code_read_only() -> None:
    services = _compose()["services"]
    for name, service in services.items():
        uid = str(service.get("user", "0")).split(":")[0]
        assert uid not in ("0", "root"), f"{name} runs as root"
    for name in ("triton", "gateway"):
        assert "artifacts:/cache:ro" in services[name]["volumes"], name
        assert services[name]["read_only"] is True, name


def test_compose_secrets_are_files_never_values() -> None:
    compose = _compose()
    declared = compose["secrets"]
    assert set(declared) >= {"avatar_session_secret", "avatar_api_key", "avatar_gateway_key"}
    assert all(set(s) == {"file"} for s in declared.values()), "compose secrets from files"
    for name, service in compose["services"].items():
        env = service.get("environment", {})
        for key in KEY_ENVS:
            assert key not in env, f"{name}: {key} as a value; use {key}_FILE"
            if f"{key}_FILE" in env:
                path = env[f"{key}_FILE"]
                assert path.startswith("/run/secrets/"), (name, key)
                assert path.rsplit("/", 1)[1] in service["secrets"], (name, key)
        command = " ".join(map(str, service.get("command", [])))
        assert "api-key=" not in command and "--api-key" not in command, name
    assert {f"{key}_FILE" for key in KEY_ENVS} <= set(compose["services"]["gateway"]["environment"])
    ignore = (PROJECT_ROOT / "deploy" / "secrets" / ".gitignore").read_text().split()
    assert "*" in ignore, "deploy/secrets/ is never committed"


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
    targets = {s["build"]["target"] for s in _compose()["services"].values() if "build" in s}
    assert targets == set(stages)
    assert 'pip install --no-cache-dir -e ".[serve,models]"' in text, "BLS models import avatar"
    blocks = dict(zip(stages, re.split(r"^FROM .*$", text, flags=re.MULTILINE)[1:], strict=True))
    for stage, block in blocks.items():
        users = re.findall(r"^USER (\S+)$", block, re.MULTILINE)
        assert users and users[-1].split(":")[0] not in ("0", "root"), stage
    # `python3 -m export build`, `python3 -m serving ...` and serving.health, and what they
    # import (the configs' reader, the export's checks and metrics)
    for stage in ("engines", "server"):
        for package in ("avatar", "model_configs", "evals", "export", "networks", "serving"):
            assert f"COPY {package} {package}" in blocks[stage], (stage, package)
    assert "COPY docker/triton-entrypoint.sh" in blocks["server"]
    entrypoint = (PROJECT_ROOT / "docker" / "triton-entrypoint.sh").read_text()
    assert 'python3 -m serving.health --serve "${AVATAR_HEALTH_PORT:-8003}"' in entrypoint
    assert "--grpc-restricted-protocol=" in entrypoint and "AVATAR_API_KEY_FILE" in entrypoint


# ------------------------------------------------------------------ Kubernetes


def _pod(kind: str, name: str) -> dict[str, Any]:
    return _one(kind, name)["spec"]["template"]


def test_every_manifest_parses_and_kustomization_lists_them() -> None:
    assert DOCUMENTS, "deploy/k8s has manifests"
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    files = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kustomization["resources"]) == files | {"../haproxy"}
    assert not [n for n in files if "envoy" in n], "Envoy is gone: HAProxy installs here"
    generator = yaml.safe_load((HAPROXY_DIR / "kustomization.yaml").read_text())
    (config_map,) = generator["configMapGenerator"]
    assert config_map["files"] == ["haproxy.cfg"]
    volumes = _pod("Deployment", "avatar-haproxy")["spec"]["volumes"]
    assert {"name": "config", "configMap": {"name": config_map["name"]}} in volumes


def test_kustomize_renders_the_haproxy_config_from_its_file() -> None:
    """`kubectl kustomize` (offline) builds the tree: the ConfigMap holds haproxy.cfg as is,
    under a content-hashed name that the HAProxy Deployment refers to."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl (kustomize) not installed")
    rendered = subprocess.run(
        [kubectl, "kustomize", str(K8S)], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    (config,) = [d for d in docs if d["metadata"]["name"].startswith("avatar-haproxy-config")]
    assert config["data"]["haproxy.cfg"] == HAPROXY_CFG.read_text()
    (haproxy,) = [d for d in docs if d["metadata"]["name"] == "avatar-haproxy" and "spec" in d
                  and d["kind"] == "Deployment"]  # fmt: skip
    (volume,) = haproxy["spec"]["template"]["spec"]["volumes"]
    assert volume["configMap"]["name"] == config["metadata"]["name"] != "avatar-haproxy-config"
    assert len(docs) == len(DOCUMENTS)  # less the Kustomization, plus the ConfigMap


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
    check = ["python3", "-m", "serving.health", "--check"]
    assert container["readinessProbe"]["exec"]["command"] == check
    assert container["startupProbe"]["exec"]["command"] == check
    assert container["livenessProbe"]["exec"]["command"] == [*check, "--live"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http": 8000, "grpc": 8001, "metrics": 8002, "health": 8003}
    assert pod["metadata"]["annotations"]["prometheus.io/port"] == "8002"
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert mounts["/cache"]["name"] == "artifacts" and mounts["/cache"]["readOnly"] is True
    assert mounts["/cache/ort-tensorrt"]["subPath"] == "ort-tensorrt", "only caches written"
    assert mounts["/dev/shm"]["name"] == "dshm"
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["dshm"]["emptyDir"]["medium"] == "Memory"
    assert volumes["artifacts"]["persistentVolumeClaim"]["claimName"] == "avatar-artifacts"
    env = {e["name"]: e for e in container["env"]}
    assert env["AVATAR_REDIS_URL"]["valueFrom"]["configMapKeyRef"] == {
        "name": "avatar-redis",
        "key": "url",
    }
    assert _one("ConfigMap", "avatar-redis")["data"]["url"].startswith("redis://avatar-redis:")
    assert _one("StatefulSet", "avatar-redis")["spec"]["serviceName"] == "avatar-redis"
    assert _one("Service", "avatar-redis")["spec"]["clusterIP"] == "None"
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


BRAIN_ENVS = (
    "AVATAR_LLM_URL",
    "AVATAR_LLM_MODEL",
    "AVATAR_LLM_API_KEY_FILE",
    "AVATAR_PERSONA_FILE",
    "AVATAR_KNOWLEDGE_DIR",
)


def test_the_brain_is_configured_by_the_operator_and_optional() -> None:
    """Both deployments pass the LLM endpoint, its key's file, the persona file and the
    documents' folder to Triton; unset, the packaged model answers as before."""
    from avatar.knowledge import KNOWLEDGE_DIR_ENV
    from avatar.llm.persona import PERSONA_FILE_ENV
    from avatar.llm.settings import KEY_ENV, MODEL_ENV, URL_ENV

    assert set(BRAIN_ENVS) == {URL_ENV, MODEL_ENV, f"{KEY_ENV}_FILE"} | {
        PERSONA_FILE_ENV,
        KNOWLEDGE_DIR_ENV,
    }
    compose = _compose()
    triton = compose["services"]["triton"]
    env = triton["environment"]
    assert set(BRAIN_ENVS) <= set(env)
    for name in set(BRAIN_ENVS) - {"AVATAR_LLM_API_KEY_FILE"}:
        assert env[name] == f"${{{name}:-}}", name  # empty by default: the packaged brain
    assert env["AVATAR_LLM_API_KEY_FILE"] == "/run/secrets/avatar_llm_api_key"
    assert "avatar_llm_api_key" in triton["secrets"]
    assert set(compose["secrets"]["avatar_llm_api_key"]) == {"file"}
    assert "./operator:/operator:ro" in triton["volumes"]

    pod = _one("Deployment", "triton-avatar")["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    k8s_env = {e["name"]: e for e in container["env"]}
    for name in BRAIN_ENVS:
        ref = k8s_env[name]["valueFrom"]["configMapKeyRef"]
        assert ref["name"] == "avatar-brain" and ref["optional"] is True, name
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["llm-key"]["secret"]["optional"] is True
    assert volumes["persona"]["configMap"] == {"name": "avatar-persona", "optional": True}
    assert volumes["knowledge"]["configMap"] == {"name": "avatar-knowledge", "optional": True}
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert all(mounts[v]["readOnly"] for v in ("llm-key", "persona", "knowledge"))


def test_rolling_updates_drain() -> None:
    """New pod first; the old one leaves rotation, finishes its turns (~60 s at most) during
    preStop, and is stopped within its grace period."""
    for name in ("triton-avatar", "avatar-gateway", "avatar-haproxy"):
        deployment = _one("Deployment", name)
        rolling = deployment["spec"]["strategy"]["rollingUpdate"]
        assert rolling["maxUnavailable"] == 0 and rolling["maxSurge"] >= 1, name
        spec = deployment["spec"]["template"]["spec"]
        (container,) = spec["containers"]
        if name == "triton-avatar":  # the entry point drains (tritonserver alone would not)
            env = {e["name"]: e.get("value") for e in container["env"]}
            waits = [int(env["AVATAR_DRAIN_SECONDS"]), 30]  # + Triton's own exit
            assert env["AVATAR_DRAIN_FILE"].startswith("/tmp/")
        else:
            pre_stop = " ".join(container["lifecycle"]["preStop"]["exec"]["command"])
            waits = [int(s) for s in re.findall(r"sleep (\d+)", pre_stop)]
        assert waits and max(waits) > 60, (name, waits)
        assert spec["terminationGracePeriodSeconds"] > sum(waits), name
    triton = _compose()["services"]["triton"]
    assert int(triton["environment"]["AVATAR_DRAIN_SECONDS"]) > 60
    assert int(triton["stop_grace_period"].rstrip("s")) > int(
        triton["environment"]["AVATAR_DRAIN_SECONDS"]
    )
    headless = _one("Service", "triton-avatar-headless")
    assert headless["spec"]["publishNotReadyAddresses"] is False, "not ready: out of HAProxy"


def test_triton_is_private() -> None:
    for _, doc in DOCUMENTS:
        if doc["kind"] == "Service":
            assert doc["spec"]["type"] == "ClusterIP", doc["metadata"]["name"]
    entry = _one("Service", "triton-avatar")
    assert {p["name"]: p["port"] for p in entry["spec"]["ports"]} == {"grpc": 8001}
    balancer = _pod("Deployment", "avatar-haproxy")["metadata"]["labels"]
    assert all(balancer[k] == v for k, v in entry["spec"]["selector"].items())

    policy = _one("NetworkPolicy", "triton-avatar")
    server = _pod("Deployment", "triton-avatar")["metadata"]["labels"]
    selector = policy["spec"]["podSelector"]["matchLabels"]
    assert selector and all(server[k] == v for k, v in selector.items())
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    admitted: dict[int, list[dict[str, Any]]] = {}
    for rule in policy["spec"]["ingress"]:
        for port in rule["ports"]:
            admitted.setdefault(port["port"], []).extend(rule["from"])
    assert set(admitted) == {8000, 8001, 8002, 8003}
    peers = [p["podSelector"]["matchLabels"] for p in admitted[8001]]
    assert {m.get("app.kubernetes.io/component") for m in peers} == {"balancer", "gateway", None}
    assert {"triton-avatar/trusted": "true"} in peers
    assert [p["podSelector"]["matchLabels"] for p in admitted[8003]] == [balancer]
    (prometheus,) = admitted[8002]
    assert prometheus["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "prometheus"}
    redis = _one("NetworkPolicy", "avatar-redis")["spec"]["ingress"]
    assert [r["from"][0]["podSelector"]["matchLabels"] for r in redis] == [server]


def test_gateway_is_the_public_edge_over_tls() -> None:
    (ingress,) = [d for _, d in DOCUMENTS if d["kind"] == "Ingress"]
    (tls,) = ingress["spec"]["tls"]
    (rule,) = ingress["spec"]["rules"]
    assert tls["secretName"] and tls["hosts"] == [rule["host"]]
    (path,) = rule["http"]["paths"]
    assert path["backend"]["service"]["name"] == "avatar-gateway"
    (container,) = _pod("Deployment", "avatar-gateway")["spec"]["containers"]
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["path"] == "/healthz", probe
    args = container["args"]
    assert args[args.index("--triton-url") + 1] == "triton-avatar:8001", "through HAProxy"
    assert {e["name"] for e in container["env"]} == {f"{k}_FILE" for k in KEY_ENVS}


def _containers(doc: dict[str, Any]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    spec = doc["spec"]["template"]["spec"]
    pod = spec.get("securityContext", {})
    return [(pod, c) for c in spec.get("initContainers", []) + spec["containers"]]


def test_no_container_runs_as_root() -> None:
    pods = [(label, d) for label, d in DOCUMENTS if d["kind"] in POD_KINDS]
    assert len(pods) >= 5
    for label, doc in pods:
        for pod, container in _containers(doc):
            context = {**pod, **container.get("securityContext", {})}
            where = (label, container["name"])
            assert context.get("runAsNonRoot") is True, where
            assert context.get("runAsUser", 0) != 0, where
            assert context.get("allowPrivilegeEscalation") is False, where
    for name in ("triton-avatar", "avatar-gateway", "avatar-haproxy"):
        (container,) = _pod("Deployment", name)["spec"]["containers"]
        assert container["securityContext"]["readOnlyRootFilesystem"] is True, name


def test_secrets_are_referenced_never_inlined() -> None:
    assert not [d for _, d in DOCUMENTS if d["kind"] == "Secret"], "the operator creates them"
    folders = set()
    for label, doc in DOCUMENTS:
        if doc["kind"] not in POD_KINDS:
            continue
        for _, container in _containers(doc):
            for env in container.get("env", []):
                assert env["name"] not in KEY_ENVS or "valueFrom" in env, (label, env)
                if env["name"].removesuffix("_FILE") in KEY_ENVS and "value" in env:
                    folders.add(env["value"].rsplit("/", 1)[0])
            flat = " ".join(map(str, container.get("args", []) + container.get("command", [])))
            assert "api-key=" not in flat and "--api-key" not in flat, label
        for volume in doc["spec"]["template"]["spec"].get("volumes", []):
            if "secret" in volume:
                assert volume["secret"]["secretName"] == "avatar-keys", label
    assert folders == {"/var/run/secrets/avatar"}


# ------------------------------------------------------------------ HAProxy


def test_haproxy_hashes_grpc_on_the_session_id() -> None:
    cfg = HAPROXY_CFG.read_text()
    backend = cfg.split("backend triton_replicas", 1)[1].split("\nfrontend", 1)[0]
    assert re.search(r"^\s+balance hdr\(session-id\)$", backend, re.MULTILINE)
    assert re.search(r"^\s+hash-type consistent$", backend, re.MULTILINE)
    assert re.search(r'bind "\$\{AVATAR_LB_BIND-:8001\}" proto h2$', cfg, re.MULTILINE)
    assert re.search(r"^\s+# servers\n\s+server-template triton ", backend, re.MULTILINE)
    (template,) = re.findall(r"^\s+server-template .*$", backend, re.MULTILINE)
    assert "proto h2" in template and "check-proto h1" in template
    assert all(f" {s} " in backend for s in ("inter 1s", "fall 2", "rise 2"))
    assert "uri /health " in backend and 'port "${TRITON_HEALTH_PORT-8003}"' in backend
    assert "option redispatch" in cfg and re.search(r"^\s+retries \d+$", cfg, re.MULTILINE)
    assert re.search(r"^\s+timeout (client|server) 120s$", cfg, re.MULTILINE), "> a turn"
    stats = cfg.split("frontend stats", 1)[1]
    assert 'bind "${AVATAR_LB_STATS_BIND-127.0.0.1:8404}"' in stats, "stats on loopback only"
    assert "stats enable" not in cfg.split("frontend stats", 1)[0]
    # Kubernetes gives HAProxy the headless Service by its fully qualified name
    (container,) = _pod("Deployment", "avatar-haproxy")["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["TRITON_GRPC"] == "triton-avatar-headless.$(POD_NAMESPACE).svc.cluster.local:8001"
    assert _one("Service", "triton-avatar-headless")["spec"]["clusterIP"] == "None"


def _haproxy() -> str:
    haproxy = shutil.which("haproxy")
    if haproxy is None:
        pytest.skip("haproxy not installed (scripts/setup.sh --tests installs it)")
    return haproxy


def _haproxy_check(path: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [_haproxy(), "-c", "-f", str(path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def test_haproxy_config_is_valid(tmp_path: Path) -> None:
    """`haproxy -c` on the shipped file (with compose's and with Kubernetes' TRITON_GRPC),
    on the local variant with static servers, and a broken file is refused."""
    for address in ("triton:8001", "triton-avatar-headless.avatar.svc.cluster.local:8001"):
        checked = _haproxy_check(HAPROXY_CFG, {**environment(), "TRITON_GRPC": address})
        assert checked.returncode == 0, checked.stderr
    local = tmp_path / "local.cfg"
    local.write_text(local_config({"r1": (18001, 18003), "r2": (28001, 28003)}))
    checked = _haproxy_check(local, environment())
    assert checked.returncode == 0 and "WARNING" not in checked.stderr, checked.stderr
    broken = tmp_path / "broken.cfg"
    broken.write_text(HAPROXY_CFG.read_text().replace("hash-type consistent", "hash-type ring"))
    assert _haproxy_check(broken, environment()).returncode != 0


def _until(condition: Callable[[], bool], what: str, timeout_s: float = 10) -> float:
    """Seconds until `condition()` held; fails past `timeout_s`."""
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > timeout_s:
            pytest.fail(f"not within {timeout_s} s: {what}")
        time.sleep(0.1)
    return time.monotonic() - started


def test_haproxy_routes_sessions_by_hash_and_fails_over(tmp_path: Path) -> None:
    """The shipped config in front of two h2c gRPC backends, each health-checked on its own
    serving.health endpoint: a session stays on one backend, sessions spread over both,
    calls without the header reach both; a backend whose health answers 503 is out of
    rotation within 3 s (its sessions move, the others stay) and gets them back when it
    recovers (the hash is consistent)."""
    grpc = pytest.importorskip("grpc")
    from serving.health import Verdict, health_server

    healthy = {"a": True, "b": True}
    servers, cleanup = {}, contextlib.ExitStack()
    with cleanup:
        for name in healthy:
            backend = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
            who = grpc.unary_unary_rpc_method_handler(lambda _r, _c, n=name: n.encode())
            backend.add_generic_rpc_handlers(
                (grpc.method_handlers_generic_handler("test.Echo", {"Who": who}),)
            )
            grpc_port = backend.add_insecure_port("127.0.0.1:0")
            backend.start()
            cleanup.callback(backend.stop, None)
            health = health_server(lambda n=name: Verdict(healthy[n], n), 0, "127.0.0.1")
            threading.Thread(target=health.serve_forever, daemon=True).start()
            cleanup.callback(health.server_close)
            cleanup.callback(health.shutdown)
            servers[name] = (grpc_port, health.server_address[1])

        port = cleanup.enter_context(running_haproxy(local_config(servers), tmp_path))
        channel = cleanup.enter_context(grpc.insecure_channel(f"127.0.0.1:{port}"))
        method = channel.unary_unary("/test.Echo/Who")

        def call(session: str | None = None) -> str:
            metadata = (("session-id", session),) if session else None
            return method(b"", metadata=metadata, timeout=5).decode()

        def anonymous_reach_both() -> bool:
            with contextlib.suppress(grpc.RpcError):
                return {call() for _ in range(4)} == {"a", "b"}
            return False

        _until(anonymous_reach_both, "both backends up and round robin without the header")
        route = {f"session-{n}": call(f"session-{n}") for n in range(24)}
        assert set(route.values()) == {"a", "b"}, route
        assert all(call(s) == r for s, r in route.items() for _ in range(2)), "affinity"

        healthy["a"] = False
        moved = _until(lambda: all(call(s) == "b" for s in route), "a out of rotation", 3)
        print(f"a out of rotation {moved:.1f} s after its health said 503")
        healthy["a"] = True
        _until(lambda: all(call(s) == r for s, r in route.items()), "a back in rotation", 8)


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
    from model_configs.pbtxt import SOURCE_REPOSITORY, parse_config

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
