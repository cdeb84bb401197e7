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


MAX_SESSION_ID_CHARS = 128


def check_session_id(value: str, what: str = "session_id") -> str:
    """`value` stripped, or a RequestError when it is not a session id."""
    value = value.strip()
    if len(value) > MAX_SESSION_ID_CHARS or not value.isprintable():
        raise RequestError(
            f"{what} {value[:20]!r}... is not a session id: expected at most "
            f"{MAX_SESSION_ID_CHARS} printable characters"
        )
    return value
