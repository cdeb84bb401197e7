"""The packaged SmolLM2-135M-Instruct read as an end-of-turn detector: measured for issue 43
against the served `turn_words` regression, and not adopted (docs/performance.md section 25,
"Fourth round").

The words so far are read as LiveKit's turn detector reads its model, zero shot: after the
chat template's `<|im_start|>user` line and the user's words (Whisper's end punctuation
dropped: it ends a fragment such as "Can you tell me." with a full stop), how likely is the
next token to end the turn (`<|im_end|>`) or the sentence (a token that starts with ".",
"?" or "!")? The graph built here answers that probability itself from the last position's
logits; its 8-bit weight-only variant (MatMulNBits, llm_decoder's quantiser) costs ~48 ms
of one CPU core at the 20-token limit. It is checked on finished and cut turns of the
packaged conversations (chitchat-dataset, chatterbot-corpus; export/turn_words/recipe.py
draws them): the build fails when the FP32 graph differs from PyTorch or cannot tell them
apart, and the INT8 variant is used while it ranks them as FP32 does.

Not served and not in export.registry.RECIPES (a fresh build does not pay for it):
`python -m perf turn-taking --words-scorer smollm2` builds it on first use. The branch
`issue43-served-chat-model` holds the served form (an ensemble of a python prompt model and
this graph) that was measured.
"""

from __future__ import annotations

import logging
import random
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

import numpy as np

from export.common import ArtifactRecipe, ensure, torch_to_onnx
from export.quantize import VARIANT_FILE
from export.sidecar import Sidecar, sha256_file
from export.turn_words.recipe import (
    CHATTERBOT,
    CHITCHAT,
    _data,
    conversations,
    examples,
    figures,
)

log = logging.getLogger(__name__)

PROMPT = "<|im_start|>user\n"  # the chat template's opening of a user turn (SmolLM2)
MAX_TOKENS = 20  # read at most: the prompt's 3 tokens and the words' last 17
BUCKET = 4  # rows are padded to a multiple of this: equal shapes batch
_WORD = re.compile(r"[^\W_]+", re.UNICODE)
_TRAILING = " \t\n.?!,;:…\"'”’)-"  # what Whisper puts after a fragment


class NoWordsError(ValueError):
    """A text with no words: there is nothing to judge (the caller goes by the audio)."""


class Encoder(Protocol):
    """What `WordsPrompt` needs of a tokenizer (avatar.llm.tokenizer.Tokenizer)."""

    pad_id: int

    def encode_segments(self, segments: Sequence) -> list[int]: ...


def spoken_words(text: str) -> str | None:
    """`text` without its end punctuation; None when it has no words."""
    if not _WORD.search(text):
        return None
    return text.strip().rstrip(_TRAILING).strip()


class WordsPrompt:
    """Texts -> the scorer graph's `input_ids` and `attention_mask` [rows, length]."""

    def __init__(self, tokenizer: Encoder, max_tokens: int = MAX_TOKENS):
        from avatar.llm.template import Segment

        self.tokenizer, self.max_tokens = tokenizer, max_tokens
        self._segment = Segment
        self.prefix = tokenizer.encode_segments([Segment(PROMPT, plain=False)])

    def ids(self, text: str) -> list[int]:
        """The prompt's tokens and the last of the words' (special-token strings in the
        words are plain text: a transcript cannot close the turn itself)."""
        said = spoken_words(text)
        if said is None:
            raise NoWordsError(f"no words to judge in {text[:80]!r}; expected a transcript")
        tokens = self.tokenizer.encode_segments([self._segment(said, plain=True)])
        return self.prefix + tokens[-(self.max_tokens - len(self.prefix)) :]

    def rows(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """int64 `input_ids` and `attention_mask`, left-padded to a multiple of BUCKET."""
        rows = [self.ids(text) for text in texts]
        longest = max(len(row) for row in rows)
        length = min(-(-longest // BUCKET) * BUCKET, max(self.max_tokens, longest))
        ids = np.full((len(rows), length), self.tokenizer.pad_id, np.int64)
        mask = np.zeros((len(rows), length), np.int64)
        for k, row in enumerate(rows):
            ids[k, length - len(row) :] = row
            mask[k, length - len(row) :] = 1
        return ids, mask


INPUTS, OUTPUT = ("input_ids", "attention_mask"), "probability"
CHECK_EVERY = 20  # conversation i is read for the check when i % 20 == 0
CHECK_TURNS = 160  # finished and as many cut turns, drawn from those conversations
SEED = 0
MIN_AUC = 0.85  # finished turns ranked above cut ones
ATOL = 2e-4  # the FP32 graph against PyTorch, on probabilities
# the 8-bit variant against FP32: ranks the turns as well (the task), and no answer moves
# by more than 0.1 (measured: 0.066 at most, medians within 0.003)
INT8_GATE = {"auc_drop": 0.01, "max_abs_diff": 0.1}
OPSET = 17


def check_turns() -> tuple[list[str], np.ndarray]:
    """(texts, finished [n] bool): CHECK_TURNS finished and as many cut turns, drawn with a
    fixed seed from every CHECK_EVERY-th conversation."""
    rng = random.Random(SEED)
    pools: dict[bool, list[str]] = {True: [], False: []}
    for index, conversation in enumerate(conversations()):
        if index % CHECK_EVERY == 0:
            for message in conversation:
                for text, finished in examples(message, rng):
                    if re.search(r"\w", text):
                        pools[finished].append(text)
    texts = rng.sample(pools[True], CHECK_TURNS) + rng.sample(pools[False], CHECK_TURNS)
    return texts, np.array([True] * CHECK_TURNS + [False] * CHECK_TURNS)


def end_ids(tokenizer) -> list[int]:
    """The tokens that end a turn or a sentence: `<|im_end|>`, and every token that starts
    with ".", "?" or "!" and holds no word character."""
    ids = {tokenizer.convert_tokens_to_ids("<|im_end|>")}
    for token_id in tokenizer.get_vocab().values():
        piece = tokenizer.decode([token_id]).strip()
        if piece[:1] in (".", "?", "!") and not re.search(r"\w", piece):
            ids.add(token_id)
    return sorted(ids)


def scorer_module(model, ends: list[int]):  # -> torch.nn.Module
    """(input_ids, attention_mask) [rows, length], left-padded -> probability [rows, 1]."""
    import torch

    class EndOfTurn(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = model
            self.register_buffer("ends", torch.tensor(ends, dtype=torch.int64))

        def forward(self, input_ids, attention_mask):
            length = input_ids.shape[1]
            positions = (attention_mask.cumsum(-1) - 1).clamp(min=0)
            index = torch.arange(length, device=input_ids.device)
            causal = index[None, :] <= index[:, None]
            allowed = causal[None, None] & attention_mask[:, None, None, :].bool()
            # additive mask, -1e4 as the llm_decoder's: finite in FP16 (TensorRT)
            mask = torch.where(allowed, torch.zeros(()), torch.tensor(-1e4))
            hidden = self.inner.model(
                input_ids=input_ids, attention_mask=mask, position_ids=positions, use_cache=False
            ).last_hidden_state[:, -1]
            logp = torch.log_softmax(self.inner.lm_head(hidden).float(), -1)
            return torch.logsumexp(logp[:, self.ends], -1, keepdim=True).exp()

    return EndOfTurn().eval()


def score(session, prompt: WordsPrompt, texts: list[str]) -> np.ndarray:
    """[n] probabilities from an ONNX Runtime session, a text at a time (as served)."""
    out = []
    for text in texts:
        ids, mask = prompt.rows([text])
        out.append(session.run([OUTPUT], {"input_ids": ids, "attention_mask": mask})[0][0, 0])
    return np.array(out, np.float32)


class ChatModelWordsRecipe(ArtifactRecipe):
    name = "turn_words_chat"  # not a served model: perf's scorer

    def __init__(self) -> None:
        import export.llm.recipe
        import export.turn_words.recipe
        from export.llm.convert import packaged_smollm2

        self.checkpoint = packaged_smollm2()
        # the 8-bit variant is llm_decoder's quantiser; the check turns are drawn there
        self.code_files = (
            Path(export.llm.recipe.__file__),
            Path(export.turn_words.recipe.__file__),
        )

    def key_inputs(self) -> dict[str, str]:
        import torch
        import transformers

        inputs = {f"source:{p.name}": sha256_file(p) for p in self.checkpoint.files}
        inputs.update(
            chitchat=sha256_file(_data(CHITCHAT)),
            chatterbot=",".join(sha256_file(p) for p in sorted(_data(CHATTERBOT).glob("*.yml"))),
            opset=str(OPSET),
            torch=torch.__version__,
            transformers=transformers.__version__,
        )
        return inputs

    def build(self, out_dir: Path) -> Sidecar:
        import torch

        from avatar.llm.tokenizer import Tokenizer
        from export.common import onnx_session
        from export.llm.convert import load_checkpoint
        from export.llm.recipe import TOKENIZER_FILES, quantize_weights

        model, hf_tokenizer = load_checkpoint(self.checkpoint)
        hf_tokenizer.save_pretrained(out_dir)
        for extra in out_dir.iterdir():  # the tokenizer's files only
            if extra.name not in TOKENIZER_FILES:
                extra.unlink()
        ends = end_ids(hf_tokenizer)
        module = scorer_module(model, ends)
        prompt = WordsPrompt(Tokenizer(out_dir))
        path, variant = out_dir / "model.onnx", out_dir / VARIANT_FILE
        example = prompt.rows(["Can you tell me", "Where is the nearest pharmacy"])
        torch_to_onnx(
            module,
            [torch.from_numpy(a) for a in example],
            path,
            inputs=INPUTS,
            outputs=[OUTPUT],
            opset=OPSET,
            dynamic_axes={
                **{name: {0: "batch", 1: "tokens"} for name in INPUTS},
                OUTPUT: {0: "batch"},
            },
        )
        texts, finished = check_turns()
        fp32 = score(onnx_session(path, threads=2), prompt, texts)
        with torch.no_grad():
            reference = np.array(
                [
                    module(*(torch.from_numpy(a) for a in prompt.rows([t]))).item()
                    for t in texts[:32]
                ]
            )
        worst = float(np.abs(fp32[:32] - reference).max())
        if worst > ATOL:
            raise ValueError(f"turn_words_chat: ONNX differs from PyTorch by {worst:.2e} > {ATOL}")
        fp32_figures = figures(fp32, finished)
        log.info("turn_words_chat FP32 on %d turns: %s", len(texts), fp32_figures)
        if fp32_figures["auc"] < MIN_AUC:
            raise ValueError(
                f"turn_words_chat: {fp32_figures}; expected AUC >= {MIN_AUC}: the graph or the "
                "data are wrong"
            )
        quantize_weights(path, variant, bits=8)
        int8 = score(onnx_session(variant, threads=2), prompt, texts)
        int8_figures = figures(int8, finished)
        diff = float(np.abs(int8 - fp32).max())
        passes = (
            int8_figures["auc"] >= fp32_figures["auc"] - INT8_GATE["auc_drop"]
            and diff <= INT8_GATE["max_abs_diff"]
        )
        why = f"AUC {int8_figures['auc']} vs FP32 {fp32_figures['auc']}, max |diff| {diff:.4f}"
        log.info("turn_words_chat INT8: %s (%s)", int8_figures, why)
        return self.sidecar(
            path,
            opset=OPSET,
            source={f"source:{p.name}": sha256_file(p) for p in self.checkpoint.files},
            validation={
                "licence": "SmolLM2-135M-Instruct (Apache-2.0); check turns: chitchat-dataset "
                "(MIT), chatterbot-corpus (BSD)",
                "reference": "the checkpoint in PyTorch FP32",
                "outputs": {OUTPUT: {"max_abs_diff": worst, "atol": ATOL}},
                "task": {"set": "finished vs cut conversation turns", **fp32_figures},
                "variants": {
                    VARIANT_FILE: {
                        "passes_gate": passes,
                        "why": why,
                        "gate": INT8_GATE,
                        **int8_figures,
                        "max_abs_diff": round(diff, 5),
                    }
                },
            },
            notes=[
                "input: WordsPrompt (<|im_start|>user + the words, end marks dropped, the "
                f"last {MAX_TOKENS} tokens, left-padded)",
                f"end tokens: {len(ends)} (<|im_end|> and the '.', '?', '!' tokens)",
                "8-bit weights: export.llm.recipe.quantize_weights (MatMulNBits)",
            ],
        )


def scorer(variant: str = VARIANT_FILE) -> Callable[[str], float | None]:
    """The graph in-process (one ONNX Runtime thread; `variant`: "model.onnx" for FP32):
    text -> the probability that its words are a finished turn; None when it has none."""
    from avatar.llm.tokenizer import Tokenizer
    from export.common import onnx_session

    folder = ensure(ChatModelWordsRecipe())
    record = Sidecar.load(folder).validation["variants"].get(variant, {"passes_gate": True})
    if not record.get("passes_gate"):
        log.warning("turn_words_chat: %s failed its gate (%s); using model.onnx", variant, record)
        variant = "model.onnx"
    session, prompt = onnx_session(folder / variant), WordsPrompt(Tokenizer(folder))

    def one(text: str) -> float | None:
        return None if spoken_words(text) is None else float(score(session, prompt, [text])[0])

    return one
