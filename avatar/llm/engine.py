"""The chat engine: a request (messages JSON, session id, sampling JSON) -> a generation on
the scheduler, with the persona, session memory and context bound applied."""

from __future__ import annotations

import dataclasses
import json
import queue
from collections.abc import Callable, Iterator
from typing import Any

from avatar.errors import RequestError
from avatar.llm.cache import PrefixCache
from avatar.llm.decoder import Decoder
from avatar.llm.sampling import Sampler, SamplingParams
from avatar.llm.scheduler import Event, Generation, Scheduler
from avatar.llm.session import SessionStore, bound_context
from avatar.llm.stream import TextStream
from avatar.llm.template import MAX_PROMPT_CHARS, Message, parse_messages, with_persona
from avatar.llm.tokenizer import Tokenizer

DEFAULT_PERSONA = (
    "You are Mia, a warm and cheerful receptionist avatar. "
    "Answer in one to three short spoken sentences."
)


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    persona: str = DEFAULT_PERSONA
    context_tokens: int = 1024  # prompt + reply; older turns are dropped to fit
    max_batch: int = 8
    prefix_cache_entries: int = 16
    sessions: int = 256
    max_prompt_chars: int = MAX_PROMPT_CHARS
    sampling: SamplingParams = dataclasses.field(default_factory=SamplingParams)


@dataclasses.dataclass(frozen=True)
class ChatRequest:
    """A validated turn: the messages to send (persona and history applied) and controls."""

    messages: list[Message]
    new_messages: list[Message]
    session_id: str
    sampling: SamplingParams


class ChatEngine:
    """Thin glue over Tokenizer + SessionStore + PrefixCache + Scheduler."""

    def __init__(self, decoder: Decoder, tokenizer: Tokenizer, config: EngineConfig | None = None):
        self.config = config or EngineConfig()
        self.tokenizer = tokenizer
        self.sessions = SessionStore(self.config.sessions)
        self.cache = PrefixCache(self.config.prefix_cache_entries)
        self.scheduler = Scheduler(
            decoder,
            tokenizer.stop_ids,
            self.cache,
            self.config.max_batch,
            self.config.context_tokens,
        )

    def parse(
        self, messages_json: str, session_id: str = "", sampling_json: str = ""
    ) -> ChatRequest:
        """Decode and validate a request; raise RequestError saying what is wrong."""
        try:
            data = json.loads(messages_json)
        except (json.JSONDecodeError, TypeError) as error:
            raise RequestError(f"messages is not valid JSON: {error}") from None
        new = parse_messages(data, self.config.max_prompt_chars)
        sampling = self.config.sampling
        if sampling_json and sampling_json.strip():
            try:
                raw: Any = json.loads(sampling_json)
            except json.JSONDecodeError as error:
                raise RequestError(f"sampling is not valid JSON: {error}") from None
            if not isinstance(raw, dict):
                raise RequestError("sampling must be a JSON object")
            sampling = SamplingParams.from_json(raw, self.config.sampling)
        history = self.sessions.history(session_id) if session_id else []
        if new[0].role == "system" and history:
            history = history[1:] if history[0].role == "system" else history
            full = [new[0], *history, *new[1:]]
        else:
            full = with_persona([*history, *new], self.config.persona)
        budget = self.config.context_tokens - sampling.max_tokens
        if budget <= 0:
            raise RequestError(
                f"max_tokens {sampling.max_tokens} leaves no room for the prompt in a "
                f"context of {self.config.context_tokens} tokens"
            )
        full = bound_context(full, self.count_tokens, budget)
        return ChatRequest(full, new, session_id, sampling)

    def count_tokens(self, messages: list[Message]) -> int:
        return len(self.tokenizer.encode(self.tokenizer.template.render(messages)))

    def submit(
        self,
        request: ChatRequest,
        emit: Callable[[Event], None],
        is_cancelled: Callable[[], bool] = lambda: False,
    ) -> Generation:
        """Start generating; `emit` gets the events. The reply joins the session at the end."""
        template = self.tokenizer.template
        prefix, rest = template.split_system(request.messages)
        prefix_ids = self.tokenizer.encode(prefix) if prefix else []
        prompt = prefix_ids + self.tokenizer.encode(rest)
        reply: list[str] = []

        def on_event(event: Event) -> None:
            reply.extend(c.text for c in event.chunks)
            if event.finish_reason in ("stop", "length") and request.session_id:
                answer = Message("assistant", "".join(reply).strip())
                self.sessions.save(request.session_id, [*request.messages, answer])
            emit(event)

        generation = Generation(
            prompt=prompt,
            sampler=Sampler(request.sampling),
            stream=TextStream(self.tokenizer.decode, request.sampling.stop),
            emit=on_event,
            is_cancelled=is_cancelled,
            cache_prefix=len(prefix_ids),
        )
        self.scheduler.submit(generation)
        return generation

    def chat(
        self, messages_json: str, session_id: str = "", sampling_json: str = ""
    ) -> Iterator[Event]:
        """Synchronous helper (tests, benchmarks): yields events until the final one. Runs
        the scheduler inline unless it was started in a thread."""
        events: queue.Queue[Event] = queue.Queue()
        self.submit(self.parse(messages_json, session_id, sampling_json), events.put)
        threaded = self.scheduler.threaded
        while True:
            if not threaded and events.empty():
                self.scheduler.step()
                continue
            event = events.get()
            yield event
            if event.finish_reason is not None:
                return
