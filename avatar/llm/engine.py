"""The chat engine: a request (messages JSON, session id, sampling JSON) -> a reply from the
chosen backend (avatar/llm/backend.py: the packaged decoder, an OpenAI-compatible endpoint
or TensorRT-LLM), with the persona, session memory and context bound applied.

A generation submitted with a request id can be stopped by id (`stop`), the way the
TensorRT-LLM backend's `stop` input works: Triton 2.51's python backend cannot cancel a
BLS stream, so a caller that was interrupted (barge-in) says so with a second request. The
stop may also say what of the reply was actually spoken; the session then remembers that,
not the whole generated text (also after the generation already ended).
"""

from __future__ import annotations

import dataclasses
import json
import queue
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any

from avatar.conversation_tokens import ConversationTokens, resolve
from avatar.errors import RequestError, parse_json
from avatar.llm.backend import DecoderBackend, Reply, ReplyBackend
from avatar.llm.cache import PrefixCache
from avatar.llm.conversation import ConversationStore, MemoryStore, StoreError, bound_context
from avatar.llm.decoder import Decoder
from avatar.llm.grounding import About, Embed, GroundingConfig, asks_about, recalled, sources
from avatar.llm.persona import DEFAULT
from avatar.llm.sampling import SamplingParams
from avatar.llm.scheduler import Event, Scheduler
from avatar.llm.sequences import KvCacheSequences, SequenceDecoder
from avatar.llm.stream import Chunk, SentenceSplitter
from avatar.llm.subject import SubjectJudge
from avatar.llm.template import (
    MAX_PROMPT_CHARS,
    Message,
    grounded,
    parse_messages,
    with_persona,
)
from avatar.llm.tokenizer import Tokenizer
from avatar.sentences import ends_sentence, spoken_text

# the packaged avatar's system prompt (the `llm` model's default persona)
DEFAULT_PERSONA = DEFAULT.system_prompt()


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    persona: str = DEFAULT_PERSONA
    context_tokens: int = 1024  # prompt + reply; older turns are dropped to fit
    # ...and when some must go, down to this share of the prompt's budget, so that the
    # turns after it extend the same cached prefix (avatar.llm.conversation.bound_context)
    history_keep_share: float = 0.5
    max_batch: int = 8
    prefix_cache_entries: int = 16
    sessions: int = 4096  # conversations the in-process store keeps
    max_prompt_chars: int = MAX_PROMPT_CHARS
    # > 0: a reply's first piece for TTS may end at a clause break after this many words
    first_clause_words: int = 0
    sampling: SamplingParams = dataclasses.field(default_factory=SamplingParams)
    # the copy bias towards the persona, the user's words and the passages (packaged decoder)
    grounding: GroundingConfig = dataclasses.field(default_factory=GroundingConfig)
    # the sentence embedding model (texts -> vectors), for candidates chosen by embedding
    # and questions' subjects judged by it (GroundingConfig.embeds)
    embed: Embed | None = dataclasses.field(default=None, compare=False)

    def __post_init__(self) -> None:
        if not 0.0 < self.history_keep_share <= 1.0:
            raise ValueError(f"history_keep_share must be in (0, 1], got {self.history_keep_share}")


class SentenceBudget:
    """Counts a reply's spoken sentences (as the `avatar` turn does: a first clause and a
    piece with nothing to say are none) and keeps the chunks up to the `limit`-th."""

    def __init__(self, limit: int) -> None:
        self.limit, self.count = limit, 0

    @property
    def spent(self) -> bool:
        return bool(self.limit) and self.count >= self.limit

    def keep(self, chunks: list[Chunk]) -> list[Chunk]:
        kept = []
        for chunk in chunks:
            if self.spent:
                break
            kept.append(chunk)
            said = spoken_text(chunk.sentence or "")
            if said and ends_sentence(said):
                self.count += 1
        return kept


@dataclasses.dataclass(frozen=True)
class ChatRequest:
    """A validated turn: the messages to send (persona and history applied) and controls."""

    messages: list[Message]
    new_messages: list[Message]
    session_id: str  # the id its memory is kept under ("" for none)
    sampling: SamplingParams
    session_token: str = ""  # what the caller holds (returned in the final stats)
    memory_error: str = ""  # the store failed to give the history: answered without it
    # what the session keeps of the prompt (without this turn's passages); None: messages
    remembered: list[Message] | None = None
    sources: tuple[str, ...] = ()  # what the reply may copy from (avatar.llm.grounding)


class ChatEngine:
    """Thin glue over ConversationStore + a ReplyBackend (+ Tokenizer and PrefixCache for
    the packaged decoder)."""

    def __init__(
        self,
        decoder: SequenceDecoder | Decoder | ReplyBackend,
        tokenizer: Tokenizer | None = None,
        config: EngineConfig | None = None,
        *,
        store: ConversationStore | None = None,
        tokens: ConversationTokens | None = None,
    ):
        """`decoder`: a `ReplyBackend` (e.g. an OpenAI-compatible endpoint), or the packaged
        decoder with its `tokenizer`: a `SequenceDecoder` (e.g. `llm_decoder` through
        Triton, which keeps the KV caches), or a stateless `Decoder` run in-process with a
        prefix cache. `store`: where conversations live (default: this process's memory).
        `tokens`: session ids must be tokens of this secret (avatar/conversation_tokens.py);
        None trusts callers' ids."""
        self.config = config or EngineConfig()
        grounding = self.config.grounding
        if grounding.subject == "embedding" and self.config.embed is None:
            raise ValueError('grounding "subject": "embedding" needs the engine\'s embed model')
        self.judge = SubjectJudge(self.config.embed) if grounding.subject == "embedding" else None
        self.sessions = store if store is not None else MemoryStore(self.config.sessions)
        self.tokens = tokens
        self._lock = threading.Lock()
        # (session id, request id) -> its generations while generating (a client may reuse
        # ids: a stop ends all of them); the most recent finished ones stay in `_recent`,
        # so that a late stop can still correct the session's memory
        self._running: dict[tuple[str, str], list[tuple[ChatRequest, Reply]]] = {}
        self._recent: OrderedDict[tuple[str, str], ChatRequest] = OrderedDict()
        if isinstance(decoder, ReplyBackend):
            self.backend = decoder
        else:
            if tokenizer is None:
                raise ValueError("the packaged decoder needs its tokenizer")
            if isinstance(decoder, Decoder):
                decoder = KvCacheSequences(decoder, PrefixCache(self.config.prefix_cache_entries))
            self.backend = DecoderBackend(
                decoder,
                tokenizer,
                self.config.max_batch,
                self.config.context_tokens,
                self.config.embed,
            )

    @property
    def scheduler(self) -> Scheduler:
        """The decode scheduler of the packaged decoder (AttributeError for other backends)."""
        if not isinstance(self.backend, DecoderBackend):
            raise AttributeError(f"the {self.backend.name} backend has no decode scheduler")
        return self.backend.scheduler

    @property
    def tokenizer(self) -> Tokenizer:
        """The packaged decoder's tokenizer (AttributeError for other backends)."""
        if not isinstance(self.backend, DecoderBackend):
            raise AttributeError(f"the {self.backend.name} backend has no tokenizer here")
        return self.backend.tokenizer

    @property
    def cache(self) -> PrefixCache | None:
        """The prefix cache, when the decoder runs in this process."""
        if not isinstance(self.backend, DecoderBackend):
            return None
        decoder = self.backend.scheduler.decoder
        return decoder.cache if isinstance(decoder, KvCacheSequences) else None

    def parse(
        self,
        messages_json: str,
        session_id: str = "",
        sampling_json: str = "",
        parent_session_id: str = "",
        context: str = "",
    ) -> ChatRequest:
        """Decode and validate a request; raise RequestError saying what is wrong. A session
        with no memory yet starts from `parent_session_id`'s (a fork: the gateway's
        speculative turn answers in a copy of the conversation, kept only if confirmed).
        `context`: the operator's passages for this turn, read with the last user message
        (`template.grounded`) and left out of what the session remembers."""
        if len(context) > self.config.max_prompt_chars:
            raise RequestError(
                f"context has {len(context)} characters; at most {self.config.max_prompt_chars}"
            )
        token, session_id = resolve(self.tokens, session_id)
        _, parent_session_id = resolve(
            self.tokens, parent_session_id, "parent_session_id", allow_new=False
        )
        data = parse_json(messages_json, "messages")
        new = parse_messages(data, self.config.max_prompt_chars)
        sampling = self.config.sampling
        if sampling_json and sampling_json.strip():
            raw: Any = parse_json(sampling_json, "sampling")
            if not isinstance(raw, dict):
                raise RequestError("sampling must be a JSON object")
            sampling = SamplingParams.from_json(raw, self.config.sampling)
        memory_error = ""
        try:
            history = self.sessions.history(session_id) if session_id else []
            if session_id and not history and parent_session_id:
                history = self.sessions.history(parent_session_id)
        except StoreError as error:  # answered without its memory; said in the final stats
            history, memory_error = [], str(error)
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
        question = full[-1]
        if context.strip() and question.role != "user":
            raise RequestError("context needs the last message to be the user's")
        # a question about the user reads their own earlier words beside it, as passages are
        about = self._about(question)
        told = recalled(full, self.config.grounding, about)
        reading = "\n".join(part for part in (told, context.strip()) if part)
        if reading:
            full[-1] = Message("user", grounded(question.content, reading))
        keep = round(budget * self.config.history_keep_share)
        full = bound_context(full, self.count_tokens, budget, keep)
        # the passages are this turn's only: the session keeps the question as asked
        memory = [*full[:-1], question] if reading else None
        copied = ()
        if self.config.grounding.copies or self.config.grounding.chooses:
            copied = sources(
                [*full[:-1], question],
                self.config.grounding,
                context=context,
                about=about,
            )
        return ChatRequest(full, new, session_id, sampling, token, memory_error, memory, copied)

    def _about(self, question: Message) -> About:
        """Whom the user's question asks about (the judge only where it is needed)."""
        grounding = self.config.grounding
        used = grounding.recall or grounding.recall_persona or grounding.copies
        if question.role != "user" or not (used or grounding.chooses):
            return About()
        judge = self.judge.asks_the_avatar if self.judge is not None else None
        return asks_about(question.content, judge)

    def count_tokens(self, messages: list[Message]) -> int:
        return self.backend.count_tokens(messages)

    def submit(
        self,
        request: ChatRequest,
        emit: Callable[[Event], None],
        is_cancelled: Callable[[], bool] = lambda: False,
        request_id: str = "",
    ) -> Reply:
        """Start generating; `emit` gets the events. The reply joins the session at the end
        (unless a stop request said what was spoken). `request_id` makes it stoppable by
        a stop request naming the same session and id (the `avatar` model makes the ids
        itself, so one client cannot stop or rewrite another's conversation)."""
        key = (request.session_id, request_id)
        text: list[str] = []
        budget = SentenceBudget(request.sampling.max_sentences)

        def on_event(event: Event) -> None:
            event.chunks = budget.keep(event.chunks)
            if budget.spent and not reply.complete:
                reply.complete = True  # the backend ends it at its next step
            if event.finish_reason == "cancelled" and reply.complete and not reply.stopped:
                # ended by the budget, not by a caller: a finished reply, remembered
                event.finish_reason = "stop"
                event.stats = {**(event.stats or {}), "sentence_budget": budget.limit}
            text.extend(c.text for c in event.chunks)
            if event.finish_reason is not None:
                memory_error = request.memory_error
                with self._lock:
                    if event.finish_reason in ("stop", "length") and not reply.stopped:
                        memory_error = self._remember(request, "".join(text)) or memory_error
                    if request_id:
                        self._forget_running(key, reply)
                        self._recent[key] = request
                        while len(self._recent) > self.config.sessions:
                            self._recent.popitem(last=False)
                if request.session_token or memory_error:
                    event.stats = dict(event.stats or {})
                    if request.session_token:
                        event.stats["session_id"] = request.session_token
                    if memory_error:
                        event.stats["memory_error"] = memory_error
            emit(event)

        reply = Reply(
            request.messages,
            request.sampling,
            on_event,
            is_cancelled,
            SentenceSplitter(self.config.first_clause_words),
            sources=request.sources,
            grounding=self.config.grounding,
        )
        if request_id:
            with self._lock:
                self._running.setdefault(key, []).append((request, reply))
        self.backend.submit(reply)
        return reply

    def stop(self, request_id: str, spoken: str | None = None, session_id: str = "") -> str:
        """End the generation submitted as `request_id` in `session_id` (it finishes
        "cancelled" within one decode step). With `spoken`, the session keeps that as the
        assistant's answer instead of the generated text; "" keeps only the user's turn.

        Returns "stopped" (it was generating), "ended" (it had finished; only the memory
        changed) or "unknown" (no such id among the running and recent generations).
        """
        if not request_id:
            raise RequestError("stop needs the request id of the generation to stop")
        _, session_id = resolve(self.tokens, session_id, allow_new=False)
        key = (session_id, request_id)
        with self._lock:
            running = self._running.get(key)
            if running:
                for _, reply in running:
                    reply.stopped = True
                request, outcome = running[-1][0], "stopped"
            elif key in self._recent:
                request, outcome = self._recent[key], "ended"
            else:
                return "unknown"
            try:
                latest = self._is_latest_turn(request, outcome == "stopped")
            except StoreError:
                latest = False  # the store is down: nothing to correct there now
            if spoken is not None and latest:
                self._remember(request, spoken)
        return outcome

    def _forget_running(self, key: tuple[str, str], reply: Reply) -> None:
        kept = [r for r in self._running.get(key, []) if r[1] is not reply]
        if kept:
            self._running[key] = kept
        else:
            self._running.pop(key, None)

    def running(self) -> int:
        """Generations in flight that were submitted with a request id."""
        with self._lock:
            return sum(len(v) for v in self._running.values())

    def _remember(self, request: ChatRequest, answer: str) -> str:
        """Save the session as this request's messages + the answer (caller holds _lock);
        "" or why the store did not take it."""
        if not request.session_id:
            return ""
        answer = answer.strip()
        reply = [Message("assistant", answer)] if answer else []
        try:
            kept = request.messages if request.remembered is None else request.remembered
            self.sessions.save(request.session_id, [*kept, *reply])
        except StoreError as error:
            return str(error)
        return ""

    def _is_latest_turn(self, request: ChatRequest, running: bool) -> bool:
        """True unless a newer turn of the session was saved since (so its memory stays)."""
        if running or not request.session_id:
            return True
        history = self.sessions.history(request.session_id)
        n = len(request.messages)
        return history[:n] == request.messages and len(history) <= n + 1

    def warm_up(self, emit: Callable[[Event], None]) -> Reply:
        """A one-token turn with the persona, so that the decoder's prefix cache holds the
        persona's KV before the first user speaks (every prompt starts with it)."""
        hello = json.dumps([{"role": "user", "content": "Hello!"}])
        greedy = json.dumps({"temperature": 0, "max_tokens": 1})
        return self.submit(self.parse(hello, "", greedy), emit)

    def chat(
        self, messages_json: str, session_id: str = "", sampling_json: str = ""
    ) -> Iterator[Event]:
        """Synchronous helper (tests, benchmarks): yields events until the final one. Runs
        the backend inline unless it runs on its own threads."""
        events: queue.Queue[Event] = queue.Queue()
        self.submit(self.parse(messages_json, session_id, sampling_json), events.put)
        threaded = self.backend.threaded
        while True:
            if not threaded and events.empty():
                self.backend.step()
                continue
            event = events.get()
            if event.finish_reason is not None and not threaded:
                self.backend.run_until_idle()  # the end step: next turns find its cache
            yield event
            if event.finish_reason is not None:
                return
