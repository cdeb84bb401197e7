"""Errors the Triton-free core raises; model adapters turn them into per-request TritonErrors."""


class RequestError(ValueError):
    """A request is invalid: the message says what was wrong and what is expected."""


class StageError(RuntimeError):
    """A downstream model (BLS call) failed; carries the model name."""

    def __init__(self, model: str, message: str):
        super().__init__(f"{model}: {message}")
        self.model = model
