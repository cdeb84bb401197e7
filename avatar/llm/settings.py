"""Which backend the `llm` model runs and with what: its config parameters, else the
environment (`avatar serve --llm URL --persona FILE` sets the variables for the server it
starts; a deployment sets them itself). A parameter that is set wins over the
environment; the API key comes only from the environment (never a config file).

    AVATAR_LLM_BACKEND     decoder | openai | tensorrt_llm (default: openai when
                           AVATAR_LLM_URL is set, else decoder: the packaged SmolLM2)
    AVATAR_LLM_URL         an OpenAI-compatible base URL, e.g. http://127.0.0.1:8080/v1
    AVATAR_LLM_MODEL       its `model` field
    AVATAR_LLM_API_KEY     its key (or AVATAR_LLM_API_KEY_FILE: a file that holds it)
    AVATAR_PERSONA_FILE    a persona file (avatar/llm/persona.py)
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping

from avatar.credentials import read_secret
from avatar.llm.backend import BACKENDS
from avatar.llm.engine import EngineConfig
from avatar.llm.grounding import GroundingConfig
from avatar.llm.openai_api import Endpoint
from avatar.llm.persona import PERSONA_FILE_ENV, load_persona
from avatar.llm.sampling import SamplingParams
from avatar.model_parameters import ModelParameters

BACKEND_ENV = "AVATAR_LLM_BACKEND"
URL_ENV = "AVATAR_LLM_URL"
MODEL_ENV = "AVATAR_LLM_MODEL"
KEY_ENV = "AVATAR_LLM_API_KEY"


@dataclasses.dataclass(frozen=True)
class LlmSettings:
    backend: str  # one of BACKENDS
    persona: str  # the system prompt
    persona_source: str  # where it came from, for the log ("parameter" or a file)
    endpoint: Endpoint | None = None  # backend "openai"
    tensorrt_llm_model: str = "tensorrt_llm"  # backend "tensorrt_llm"

    def describe(self) -> str:
        """One line for the log (no key)."""
        if self.endpoint is not None:
            model = f" model {self.endpoint.model!r}" if self.endpoint.model else ""
            key = ", with a key" if self.endpoint.api_key else ""
            return f"openai-compatible endpoint {self.endpoint.address}{model}{key}"
        if self.backend == "tensorrt_llm":
            return f"TensorRT-LLM model {self.tensorrt_llm_model!r}"
        return "the packaged decoder"


def engine_config(params: ModelParameters, settings: LlmSettings) -> EngineConfig:
    """The chat engine's settings from the `llm` model's parameters: the served model and
    the in-process stages (serving.served.local_config) read them here alike."""
    return EngineConfig(
        persona=settings.persona,
        context_tokens=params.int("context_tokens", EngineConfig.context_tokens),
        history_keep_share=params.float("history_keep_share", EngineConfig.history_keep_share),
        max_batch=params.int("max_batch", EngineConfig.max_batch),
        sessions=params.int("sessions", EngineConfig.sessions),
        first_clause_words=params.int("first_clause_words", 0),
        sampling=SamplingParams.from_json(json.loads(params.str("sampling", "{}"))),
        grounding=GroundingConfig.from_json(params.str("grounding", "{}")),
    )


def llm_settings(
    params: ModelParameters, default_persona: str, env: Mapping[str, str] | None = None
) -> LlmSettings:
    """The backend, endpoint and persona from the config's parameters and `env`
    (default: this process's environment); ValueError naming what is wrong."""
    env = os.environ if env is None else env
    url = params.str("llm_url", "") or env.get(URL_ENV, "")
    backend = (
        params.str("backend", "") or env.get(BACKEND_ENV, "") or ("openai" if url else "decoder")
    )
    if backend not in BACKENDS:
        raise ValueError(f"model {params.model}: backend {backend!r} is not one of {BACKENDS}")
    persona_file = params.str("persona_file", "") or env.get(PERSONA_FILE_ENV, "")
    if persona_file:
        loaded = load_persona(persona_file)
        persona, source = loaded.system_prompt(), persona_file
    else:
        persona, source = params.str("persona", default_persona), "parameter"
    endpoint = None
    if backend == "openai":
        if not url:
            raise ValueError(
                f"model {params.model}: backend openai needs an endpoint: the llm_url "
                f"parameter or ${URL_ENV} (e.g. http://127.0.0.1:8080/v1)"
            )
        extra = json.loads(params.str("extra_body", "{}"))
        if not isinstance(extra, dict):
            raise ValueError(f"model {params.model}: extra_body must be a JSON object")
        endpoint = Endpoint(
            url,
            params.str("llm_model", "") or env.get(MODEL_ENV, ""),
            read_secret(KEY_ENV, env),
            params.float("connect_timeout_s", Endpoint.connect_timeout_s),
            params.float("first_token_timeout_s", Endpoint.first_token_timeout_s),
            params.float("idle_timeout_s", Endpoint.idle_timeout_s),
            extra,
        )
    return LlmSettings(
        backend,
        persona,
        source,
        endpoint,
        params.str("tensorrt_llm_model", "tensorrt_llm"),
    )
