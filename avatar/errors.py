"""Errors the Triton-free core raises; model adapters turn them into per-request TritonErrors."""

from __future__ import annotations

import json
from typing import Any


class RequestError(ValueError):
    """A request is invalid: the message says what was wrong and what is expected."""


class StageError(RuntimeError):
    """A downstream model (BLS call) failed; carries the model name."""

    def __init__(self, model: str, message: str):
        super().__init__(f"{model}: {message}")
        self.model = model


def parse_json(text: str, what: str) -> Any:
    """A request's JSON input; RequestError (never RecursionError or TypeError) when it is
    not JSON or is nested beyond what the parser can take."""
    try:
        return json.loads(text)
    except (json.JSONDecodeError, TypeError) as error:
        raise RequestError(f"{what} is not valid JSON: {error}") from None
    except RecursionError:
        raise RequestError(f"{what} is nested too deeply: expected a flat JSON object") from None
