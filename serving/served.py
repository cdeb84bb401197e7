"""What the embedded server runs, for the in-process sides of tests and benchmarks: the ONNX
file each model serves (its gated INT8 variant or model.onnx), its configured parameters, and
the turn's stages built in-process from the same graphs and settings
(avatar.pipeline.local)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from avatar.pipeline.local import LocalConfig, LocalModels


def _artifact(name: str):
    from export.registry import ensure_all

    return ensure_all([name])[name]


def served_onnx(name: str) -> Path:
    """The ONNX file the embedded server runs for `name` (`model.onnx`, or the INT8 variant
    its config names while the variant's gate passes): in-process sides of a side-by-side
    run the same graph as Triton."""
    from model_configs.pbtxt import SOURCE_REPOSITORY, parse_config
    from serving.repository import onnx_variant

    folder = _artifact(name)
    return folder / onnx_variant(parse_config(SOURCE_REPOSITORY / name / "config.pbtxt"), folder)


def served_parameters(name: str) -> dict[str, str]:
    """The `parameters` of model `name` as model_repository/ configures it."""
    from model_configs.pbtxt import SOURCE_REPOSITORY, parse_config

    config = parse_config(SOURCE_REPOSITORY / name / "config.pbtxt")
    return {key: value.string_value for key, value in config.parameters.items()}


def local_models(render: bool = False) -> LocalModels:
    """The graphs the embedded server runs, for the turn's stages in-process
    (avatar.pipeline.local); `render`: also the renderers, the served default face first."""
    from importlib import resources

    from avatar.pipeline.local import LocalModels

    avatar = served_parameters("avatar")
    asr = served_parameters("asr")
    faces = {"portrait": "portrait_renderer_model", "cartoon": "cartoon_renderer_model"}
    order = sorted(faces, key=lambda face: face != avatar["face"]) if render else []
    return LocalModels(
        asr_encoder=served_onnx(asr["encoder_model"]),
        asr_decoder=served_onnx(asr["decoder_model"]),
        asr_vocab=Path(str(resources.files(asr["tokenizer_package"]) / "data")),
        llm_decoder=served_onnx(served_parameters("llm")["decoder_model"]),
        tts_vits=served_onnx(served_parameters("tts")["vits_model"]),
        emotion_encoder=served_onnx(avatar["emotion_model"]),
        renderers={face: served_onnx(avatar[faces[face]]) for face in order},
    )


def local_config(**engine: Any) -> LocalConfig:
    """The served models' settings for the in-process stages: the asr windows, the llm's
    persona, first clause and sampling with the avatar model's reply budget;
    `engine`: EngineConfig fields to override (e.g. max_batch=1)."""
    from avatar.asr.greedy import DecodeOptions
    from avatar.asr.transcribe import AsrOptions
    from avatar.llm.engine import EngineConfig
    from avatar.llm.settings import engine_config, llm_settings
    from avatar.model_parameters import ModelParameters
    from avatar.pipeline.local import LocalConfig

    asr, llm, avatar = (served_parameters(name) for name in ("asr", "llm", "avatar"))
    rate = float(asr["max_tokens_per_second"])
    options = AsrOptions(
        decode=DecodeOptions(
            max_new_tokens=int(asr["max_new_tokens"]),
            max_tokens_per_second=rate if rate > 0 else None,
        ),
        max_seconds=float(asr["max_audio_seconds"]),
        window_step=int(asr["window_step"]) or None,
        window_margin=int(asr["window_margin"]),
    )
    # the llm's settings as its model reads them (from the config alone: no environment)
    values = {key: {"string_value": value} for key, value in llm.items()}
    params = ModelParameters({"name": "llm", "parameters": values})
    config = engine_config(params, llm_settings(params, EngineConfig.persona, env={}))
    sampling = dataclasses.replace(config.sampling, max_tokens=int(avatar["max_tokens"]))
    config = dataclasses.replace(config, sampling=sampling, **engine)
    return LocalConfig(asr=options, llm=config)
