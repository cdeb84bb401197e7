"""What a platform's chat implements to feed the queue (IRC in `irc.py`; YouTube's or
Kick's chat would be others): `run` reads the room until cancelled, reconnecting itself,
hands each message to `deliver` (normally `ChatQueue.offer`) and each moderator's removal
of a viewer (a ban, a timeout, a kick, a deleted message) to `withdraw` (normally
`ChatQueue.withdraw_viewer`), so the anchor never reads out what the room's moderators took
down; `say` posts a line back ("answering Ada next"), or does nothing where the platform
cannot.

    queue = ChatQueue(ModerationRules())
    task = asyncio.create_task(adapter.run(queue.offer, queue.withdraw_viewer))
    ...
    await adapter.say(f"Next: {question.askers()}")
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

from broadcast.chat.messages import ChatMessage
from broadcast.chat.queue import Verdict

Deliver = Callable[[ChatMessage], Verdict]
Withdraw = Callable[[str], object]  # a viewer key (ChatMessage.viewer_key)


@runtime_checkable
class ChatAdapter(Protocol):
    name: str  # the ChatMessage.source it delivers ("irc", ...)

    async def run(self, deliver: Deliver, withdraw: Withdraw | None = None) -> None:
        """Read the room and `deliver` each viewer's message until cancelled, `withdraw`
        each viewer its moderators remove; a dropped connection is reconnected here, never
        raised."""
        ...

    async def say(self, text: str) -> None:
        """Post `text` to the room, paced for the platform's flood limits; it may wait or
        drop lines (with a log) rather than get the account muted."""
        ...
