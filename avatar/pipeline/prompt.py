"""The `llm` model's request for a turn: its messages, its sampling and the operator's
passages.

The passages go in the `llm` model's `context` input: the engine reads them with the
user's message, in the form the packaged SmolLM2-135M answered best from (`python -m perf
knowledge`, docs/knowledge.md: "Information: ... / Answer this question with the
information: ..."), and the session remembers the question without them. A turn with
passages is also sampled greedily and without the repetition penalty, which otherwise
penalises the very tokens of the passage the answer must repeat (the sampler counts the
prompt's tokens).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from avatar.languages import answer_instruction
from avatar.pipeline.request import TurnRequest

# sampling of a turn answered from passages (the avatar model's `knowledge_sampling`)
KNOWLEDGE_SAMPLING: Mapping[str, Any] = {"temperature": 0.0, "repetition_penalty": 1.0}


def user_content(text: str, language: str = "") -> str:
    """The user's message: their words, then the instruction to answer in their language
    when it is not English."""
    instruction = answer_instruction(language)
    return f"{text}\n{instruction}" if instruction else text


def llm_messages(text: str, request: TurnRequest) -> list[dict[str, str]]:
    """The `messages` JSON value of the turn's `llm` request: the persona control as the
    system message (when a trusted caller set one) and the user's message."""
    persona = request.controls.persona
    messages = [{"role": "system", "content": persona}] if persona else []
    messages.append({"role": "user", "content": user_content(text, request.language)})
    return messages


def llm_sampling(
    request: TurnRequest,
    max_tokens: int = 0,
    knowledge: Mapping[str, Any] = KNOWLEDGE_SAMPLING,
) -> dict[str, Any]:
    """The `sampling` JSON value: the seed, the reply budget (`max_tokens` unless the
    controls set one; 0 leaves the llm's default) and, with passages, `knowledge`."""
    sampling: dict[str, Any] = {"seed": request.controls.seed}
    if request.controls.max_tokens or max_tokens:
        sampling["max_tokens"] = request.controls.max_tokens or max_tokens
    if request.context:
        sampling.update(knowledge)
    return sampling
