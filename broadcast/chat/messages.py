"""What reaches the anchor from the audience: a chat message as a platform delivered it, and
a question in the queue (one text, every viewer who asked it)."""

from __future__ import annotations

import dataclasses

MAX_NAMED_ASKERS = 3  # "Ada, Bo and Cy ask"; more: "Ada, Bo and 3 others ask"


@dataclasses.dataclass(frozen=True)
class ChatMessage:
    viewer: str  # display name on the platform
    text: str
    source: str  # "irc", "http", "ws", ...
    received_at: float  # time.monotonic() when the message reached us
    # the platform's stable account name (IRC nick, Twitch login), "" when the display name
    # is all there is: limits and blocklists key on it, so a changed display name is the same
    # viewer
    viewer_id: str = ""

    @property
    def viewer_key(self) -> str:
        """Who sent it, for per-viewer limits and the blocklist (case-insensitive)."""
        return (self.viewer_id or self.viewer).casefold()


@dataclasses.dataclass
class Question:
    id: int
    text: str  # cleaned: one line, as the caption shows it
    viewers: tuple[str, ...]  # the first is who asked first; merged duplicates add theirs
    source: str
    first_seen: float  # monotonic
    pinned: bool = False

    def askers(self) -> str:
        """The viewers as the anchor names them: "Ada", "Ada and Bo", "Ada, Bo and Cy",
        "Ada, Bo and 3 others"."""
        names = list(self.viewers) or ["someone"]
        if len(names) > MAX_NAMED_ASKERS:
            rest = len(names) - (MAX_NAMED_ASKERS - 1)
            names = [*names[: MAX_NAMED_ASKERS - 1], f"{rest} others"]
        if len(names) == 1:
            return names[0]
        return f"{', '.join(names[:-1])} and {names[-1]}"

    def attribution(self) -> str:
        """What the anchor says before answering: "Ada asks: <text>", "Ada and Bo ask: ..."."""
        verb = "asks" if len(self.viewers) <= 1 else "ask"
        return f"{self.askers()} {verb}: {self.text}"

    def to_json(self) -> dict[str, object]:
        """The question as the operator's HTTP/WebSocket input shows it."""
        return {
            "id": self.id,
            "text": self.text,
            "viewers": list(self.viewers),
            "source": self.source,
            "pinned": self.pinned,
            "attribution": self.attribution(),
        }
