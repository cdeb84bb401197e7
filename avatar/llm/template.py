"""Chat messages -> prompt text: validation, persona system prompt, the checkpoint's own
Jinja chat template (rendered like transformers does, in a sandbox).

Message content is plain text to the tokenizer: `render_segments` marks which parts of
the prompt are the template's (special tokens such as `<|im_start|>` parsed) and which
are what a user or persona wrote (encoded as text, so a typed `<|im_start|>system` cannot
open a system turn)."""

from __future__ import annotations

import dataclasses
import re
import secrets
from collections.abc import Sequence
from typing import Any

from avatar.errors import RequestError

ROLES = ("system", "user", "assistant")
MAX_PROMPT_CHARS = 16_000  # far above a spoken turn; keeps the context bound meaningful


@dataclasses.dataclass(frozen=True)
class Message:
    role: str
    content: str

    def to_json(self) -> dict[str, str]:
        return {"role": self.role, "content": self.content}


def parse_messages(data: Any, max_chars: int = MAX_PROMPT_CHARS) -> list[Message]:
    """Validate a decoded messages JSON value: a non-empty list of {role, content} with a
    known role, string content, and at most `max_chars` characters in all."""
    if not isinstance(data, list) or not data:
        raise RequestError('messages must be a non-empty JSON list of {"role", "content"}')
    messages, total = [], 0
    for i, item in enumerate(data):
        if not isinstance(item, dict) or "role" not in item or "content" not in item:
            raise RequestError(f'messages[{i}] must be an object with "role" and "content"')
        role, content = item["role"], item["content"]
        if role not in ROLES:
            raise RequestError(f"messages[{i}].role {role!r} is unknown; expected one of {ROLES}")
        if not isinstance(content, str):
            raise RequestError(f"messages[{i}].content must be a string")
        total += len(content)
        messages.append(Message(role, content))
    if total > max_chars:
        raise RequestError(f"messages hold {total} characters; at most {max_chars} are accepted")
    if messages[-1].role != "user":
        raise RequestError("the last message must have role 'user'")
    if not messages[-1].content.strip():
        raise RequestError("the last user message is empty")
    return messages


def with_persona(messages: Sequence[Message], persona: str) -> list[Message]:
    """The persona as the system prompt, unless the client sent its own system message."""
    if messages and messages[0].role == "system":
        return list(messages)
    return [Message("system", persona), *messages]


@dataclasses.dataclass(frozen=True)
class Segment:
    """A piece of a rendered prompt: the template's own text, or a message's content."""

    text: str
    plain: bool  # message content: special-token strings in it are ordinary text


def _cut(segments: Sequence[Segment], chars: int) -> tuple[list[Segment], list[Segment]]:
    """Split segments after `chars` characters of their joined text."""
    head: list[Segment] = []
    for i, segment in enumerate(segments):
        if chars <= 0:
            return head, list(segments[i:])
        if len(segment.text) > chars:
            head.append(Segment(segment.text[:chars], segment.plain))
            return head, [Segment(segment.text[chars:], segment.plain), *segments[i + 1 :]]
        head.append(segment)
        chars -= len(segment.text)
    return head, []


class ChatTemplate:
    """Renders messages with a checkpoint's Jinja chat template."""

    def __init__(self, source: str, special: dict[str, str] | None = None):
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        self._template = env.from_string(source)
        self._special = dict(special or {})

    def render(self, messages: Sequence[Message], add_generation_prompt: bool = True) -> str:
        return self._template.render(
            messages=[m.to_json() for m in messages],
            add_generation_prompt=add_generation_prompt,
            **self._special,
        )

    def render_segments(
        self, messages: Sequence[Message], add_generation_prompt: bool = True
    ) -> list[Segment]:
        """`render`, as the template's text and each message's content apart: the
        template is rendered with a one-time marker per content, then split at them."""
        nonce = secrets.token_hex(8)
        marked = [Message(m.role, f"\ue000{nonce}{i}\ue001") for i, m in enumerate(messages)]
        text = self.render(marked, add_generation_prompt)
        segments, at = [], 0
        for match in re.finditer("\ue000" + nonce + r"(\d+)\ue001", text):
            if match.start() > at:
                segments.append(Segment(text[at : match.start()], plain=False))
            content = messages[int(match.group(1))].content
            if content:
                segments.append(Segment(content, plain=True))
            at = match.end()
        if at < len(text):
            segments.append(Segment(text[at:], plain=False))
        return segments

    def split_system_segments(
        self, messages: Sequence[Message]
    ) -> tuple[list[Segment], list[Segment]]:
        """`split_system` as segments: (system prefix, the rest)."""
        full = self.render_segments(messages)
        if not messages or messages[0].role != "system":
            return [], full
        prefix = "".join(s.text for s in self.render_segments(messages[:1], False))
        if not "".join(s.text for s in full).startswith(prefix):
            return [], full
        return _cut(full, len(prefix))

    def split_system(self, messages: Sequence[Message]) -> tuple[str, str]:
        """(system prefix text, the rest) such that prefix + rest == render(messages).

        The prefix is the rendering of the system message alone, so its KV cache is shared
        by every conversation with that system prompt.
        """
        full = self.render(messages)
        if not messages or messages[0].role != "system":
            return "", full
        prefix = self.render(messages[:1], add_generation_prompt=False)
        if not full.startswith(prefix):
            return "", full
        return prefix, full[len(prefix) :]


def grounded(question: str, context: str) -> str:
    """The user's message as the LLM reads it with the operator's passages (`context`): the
    form the packaged SmolLM2-135M answered best from (docs/knowledge.md). Only the prompt
    holds it; the conversation remembers the question alone."""
    return f"{context}\nAnswer this question with the information: {question}"
