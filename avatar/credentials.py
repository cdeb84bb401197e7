"""Secrets from the environment, one way for every process: a variable holds the value, or
`<VARIABLE>_FILE` names a file that does (a Kubernetes or compose secret mounted as a
file). Never from a command-line argument, which `ps` shows to every user of the machine.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

API_KEY_ENV = "AVATAR_API_KEY"  # the key Triton's restricted protocols require
GATEWAY_KEY_ENV = "AVATAR_GATEWAY_KEY"  # the operator key services present to the gateway
KEY_HEADER = "avatar-api-key"  # its header (Triton's --grpc-restricted-protocol)
GRPC_HEADER_PREFIX = "triton-grpc-protocol-"  # Triton 2.51 reads `<prefix><header>` on gRPC


def read_secret(name: str, env: Mapping[str, str] | None = None) -> str:
    """$name, else the stripped content of the file $name_FILE names, else ""; ValueError
    (naming the variable, never the value) when that file cannot be read."""
    env = os.environ if env is None else env
    if env.get(name):
        return env[name]
    path = env.get(f"{name}_FILE")
    if not path:
        return ""
    try:
        return Path(path).read_text().strip()
    except OSError as error:
        raise ValueError(f"{name}_FILE={path}: {error.strerror}") from None


def gateway_key_headers() -> dict[str, str]:
    """`Authorization: Bearer <operator key>` for a service calling the gateway ({} when
    $AVATAR_GATEWAY_KEY and its _FILE are unset)."""
    key = read_secret(GATEWAY_KEY_ENV)
    return {"Authorization": f"Bearer {key}"} if key else {}


def grpc_key_headers(key: str, header: str = KEY_HEADER) -> dict[str, str]:
    """The gRPC metadata that passes Triton's API key ({} without a key)."""
    return {f"{GRPC_HEADER_PREFIX}{header}": key} if key else {}
