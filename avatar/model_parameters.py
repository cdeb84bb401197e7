"""Typed reader of a model config's `parameters` (parsed once, in `initialize`)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


class ModelParameters:
    """`parameters { key: "k" value { string_value: "v" } }` with types and defaults.

    Triton passes every parameter as a string; this parses each once and names the
    parameter and the model in any error, so a bad config fails at load time.
    """

    def __init__(self, model_config: Mapping[str, Any] | str):
        config = json.loads(model_config) if isinstance(model_config, str) else model_config
        self.model = str(config.get("name", "?"))
        raw = config.get("parameters") or {}
        self._values = {k: str(v.get("string_value", "")) for k, v in raw.items()}

    def _get(self, key: str) -> str | None:
        value = self._values.get(key)
        return value if value not in (None, "") else None

    def _fail(self, key: str, value: str, expected: str) -> ValueError:
        return ValueError(f"model {self.model}: parameter {key}={value!r} is not {expected}")

    def str(self, key: str, default: str | None = None) -> str:
        value = self._get(key)
        if value is None:
            if default is None:
                raise ValueError(f"model {self.model}: required parameter {key!r} is missing")
            return default
        return value

    def int(self, key: str, default: int) -> int:
        value = self._get(key)
        if value is None:
            return default
        try:
            return int(value)
        except ValueError:
            raise self._fail(key, value, "an integer") from None

    def float(self, key: str, default: float) -> float:
        value = self._get(key)
        if value is None:
            return default
        try:
            return float(value)
        except ValueError:
            raise self._fail(key, value, "a number") from None

    def bool(self, key: str, default: bool) -> bool:
        value = self._get(key)
        if value is None:
            return default
        if value.lower() in _TRUE:
            return True
        if value.lower() in _FALSE:
            return False
        raise self._fail(key, value, "a boolean (true/false)")
