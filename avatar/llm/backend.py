"""Where a reply's text comes from: the `llm` model's backends behind one interface.

The chat engine (avatar/llm/engine.py) owns everything around the tokens: persona,
session memory, the context bound, sentence streaming, stops with what was spoken. A
`ReplyBackend` only turns one `Reply` (the messages to answer, sampling) into streamed
text events and a final event:

- `DecoderBackend`: the packaged model on `llm_decoder` (or in-process), token ids through
  the batched `Scheduler` and this process's sampler;
- `avatar.llm.openai_api.OpenAIBackend`: any OpenAI-compatible chat-completions endpoint;
- `avatar.llm.trtllm.TensorRtLlmBackend`: TensorRT-LLM's `tensorrt_llm` model on the same
  Triton (production).

Every backend ends every reply with exactly one final event (finish reason "stop",
"length", "cancelled" or "error"), however it ends, and honours `Reply.stopped` and
`Reply.is_cancelled` within a bounded time.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable

from avatar.llm.grounding import (
    CopyBias,
    Embed,
    GroundingConfig,
    embedding_agreement,
    word_agreement,
)
from avatar.llm.sampling import Sampler, SamplingParams
from avatar.llm.scheduler import Choice, Event, Generation, Scheduler
from avatar.llm.sequences import SequenceDecoder
from avatar.llm.stream import Chunk, SentenceSplitter, TextStream
from avatar.llm.template import Message
from avatar.llm.tokenizer import Tokenizer

BACKENDS = ("decoder", "openai", "tensorrt_llm")


@dataclasses.dataclass(eq=False)
class Reply:
    """One reply being produced. `emit` may be called from any thread of the backend."""

    messages: list[Message]  # persona, history and the new turn, bounded to the context
    sampling: SamplingParams
    emit: Callable[[Event], None]
    is_cancelled: Callable[[], bool] = lambda: False
    splitter: SentenceSplitter = dataclasses.field(default_factory=SentenceSplitter)
    stopped: bool = False  # set by a stop request (another thread): ends it "cancelled"
    # the sentence budget is spent (the engine sets it): the backend ends the generation
    # as it would a cancelled one, and the engine reports it finished ("stop")
    complete: bool = False
    # what the reply may copy from (avatar.llm.grounding): read by the packaged decoder
    sources: tuple[str, ...] = ()
    grounding: GroundingConfig = dataclasses.field(default_factory=GroundingConfig)

    def ended(self) -> bool:
        """Stopped by a stop request, cancelled by its caller, or its budget spent."""
        return self.stopped or self.complete or self.is_cancelled()

    def final_chunks(self, text: str = "") -> list[Chunk]:
        """The pieces a reply that ends now still streams: `text` and its last sentence."""
        chunks = self.splitter.push(text) if text else []
        sentence = self.splitter.flush()
        if sentence:
            chunks.append(Chunk("", sentence))
        return chunks


class ReplyBackend(abc.ABC):
    """A source of replies. `threaded`: it runs on its own threads once `start()`ed;
    otherwise `step()` drives it (the in-process decoder of tests and benchmarks)."""

    name: str

    @abc.abstractmethod
    def submit(self, reply: Reply) -> None:
        """Start producing `reply`; returns at once."""

    def start(self) -> None:  # noqa: B027 - optional
        """Serve from background threads."""

    def stop(self) -> None:  # noqa: B027 - optional
        """Shut down; every reply still running ends with a final "error" event."""

    @property
    def threaded(self) -> bool:
        return True

    def step(self) -> None:  # noqa: B027 - only for backends that are not threaded
        """Advance every reply by one step (when not threaded)."""

    def idle(self) -> bool:
        return True

    def run_until_idle(self) -> None:
        """Drive the backend in the calling thread until every submitted reply ended."""
        while not self.idle():
            self.step()

    def count_tokens(self, messages: list[Message]) -> int:
        """The prompt's size in tokens, for the context bound (an estimate by default:
        about four characters a token, plus a few per message for the template)."""
        return sum(len(m.content) // 4 + 4 for m in messages)


class TokenizedPrompts:
    """The checkpoint's chat template and tokenizer in this process: prompts as token
    ids (backends that send ids: the packaged decoder, TensorRT-LLM)."""

    tokenizer: Tokenizer

    def count_tokens(self, messages: list[Message]) -> int:
        tokenizer = self.tokenizer
        return len(tokenizer.encode_segments(tokenizer.template.render_segments(messages)))

    def prompt(self, messages: list[Message]) -> list[int]:
        """The prompt's ids: the system prefix encoded apart, so that its ids (and KV) are
        the same for every conversation with that persona."""
        prefix, rest = self.tokenizer.template.split_system_segments(messages)
        return self.tokenizer.encode_segments(prefix) + self.tokenizer.encode_segments(rest)


class DecoderBackend(TokenizedPrompts, ReplyBackend):
    """The packaged decoder: the chat template and tokenizer here, token ids through the
    batched scheduler (`llm_decoder` keeps the KV caches), sampling in this process."""

    name = "decoder"

    def __init__(
        self,
        decoder: SequenceDecoder,
        tokenizer: Tokenizer,
        max_batch: int,
        context_tokens: int,
        embed: Embed | None = None,
    ):
        """`embed`: the sentence embedding model, for candidates chosen by "embedding"
        agreement (avatar.llm.grounding)."""
        self.tokenizer, self.embed = tokenizer, embed
        self.scheduler = Scheduler(decoder, tokenizer.stop_ids, max_batch, context_tokens)

    def submit(self, reply: Reply) -> None:
        prompt = self.prompt(reply.messages)
        bias = None
        if reply.grounding.copies and reply.sources:
            # a leading space: a source's first word is tokenized as it is mid-sentence
            ids = [self.tokenizer.encode(" " + text) for text in reply.sources]
            bias = CopyBias(ids, reply.grounding, len(prompt))
        generation = Generation(
            prompt=prompt,
            sampler=Sampler(reply.sampling, bias),
            stream=self._stream(reply),
            emit=reply.emit,
            is_cancelled=reply.ended,
            splitter=reply.splitter,
            choice=self._choice(reply, bias),
        )
        self.scheduler.submit(generation)

    def _stream(self, reply: Reply) -> TextStream:
        return TextStream(self.tokenizer.stream_decoder(), reply.sampling.stop)

    def _choice(self, reply: Reply, bias: CopyBias | None) -> Choice | None:
        """Candidates of the first sentence, when the reply has sources to agree with."""
        grounding = reply.grounding
        if not grounding.chooses or not reply.sources:
            return None
        sources, embed = reply.sources, self.embed

        def sampler(i: int) -> Sampler:
            params = reply.sampling
            seed = None if params.seed is None else (params.seed + 7919 * i) % 2**63
            temperature = max(params.temperature, grounding.candidate_temperature)
            return Sampler(dataclasses.replace(params, seed=seed, temperature=temperature), bias)

        def score(candidates: list[str]) -> list[float]:
            if grounding.agreement == "embedding":
                if embed is None:
                    raise ValueError("embedding agreement needs the engine's embedding model")
                return embedding_agreement(candidates, sources, embed)
            return [word_agreement(text, sources) for text in candidates]

        return Choice(
            grounding.candidates,
            sampler,
            lambda: self._stream(reply),
            score,
            first_piece=grounding.choose_after == "piece",
        )

    def start(self) -> None:
        self.scheduler.start()

    def stop(self) -> None:
        self.scheduler.stop()

    @property
    def threaded(self) -> bool:
        return self.scheduler.threaded

    def step(self) -> None:
        self.scheduler.step()

    def idle(self) -> bool:
        return self.scheduler.idle()
