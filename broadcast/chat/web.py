"""The operator's chat input over HTTP and WebSocket: routes a broadcast server mounts.

    POST /chat/messages              {"viewer": "Ada", "text": "..."} -> a verdict
    GET  /chat/queue                 the pending questions, in answering order
    POST /chat/questions/{id}/skip   (and /pin, /unpin)
    GET  /chat/ws                    a WebSocket taking the same actions as JSON messages:
        {"action": "message", "viewer": "Ada", "text": "..."}, {"action": "skip", "id": 3},
        {"action": "pin", "id": 3}, {"action": "unpin", "id": 3}, {"action": "queue"};
        each answered with one JSON message (an optional "ref" is echoed back)

A verdict is `Verdict.to_json()`: HTTP 202 when queued or merged, else the status of
`VERDICT_STATUS` with its code (`queue.REASONS`) and a message. Other errors are
`{"error": code, "message": ...}` with a code of `ERRORS`.

Who may call: whoever holds the operator key, `Authorization: Bearer <key>`, the gateway's
key ($AVATAR_GATEWAY_KEY or the file $AVATAR_GATEWAY_KEY_FILE: `operator_key_from_environment`),
compared in constant time. Without a key the routes are open only on a server bound to
loopback (mounting them for any other address raises), and even there they refuse a request
for a Host other than localhost or an IP (DNS rebinding) and one from a web page of another
origin (a site the operator visits cannot post into the show). Bodies are read up to
`MAX_BODY_BYTES`, WebSocket messages up to `MAX_WS_MESSAGE_BYTES` (larger: closed, 1009).
"""

from __future__ import annotations

import ipaddress
import json
import logging
import time
from collections.abc import Mapping
from typing import Any

from aiohttp import WSMsgType, web

from avatar.credentials import GATEWAY_KEY_ENV, read_secret
from broadcast.chat.messages import ChatMessage
from broadcast.chat.queue import ChatQueue, Verdict
from gateway.access import Hosts, Origins, bearer_matches

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 8 * 1024  # a question is 200 characters; JSON escapes make it at most ~2 KB
MAX_WS_MESSAGE_BYTES = 8 * 1024
MAX_VIEWER_FIELD_CHARS = 200  # the queue cuts names shorter; this only bounds the input
VERDICT_STATUS: dict[str, int] = {
    "accepted": 202,
    "merged": 202,
    "empty": 422,
    "no_viewer": 422,
    "too_long": 422,
    "blocked": 403,
    "repeated": 409,
    "rate_limited": 429,
    "queue_full": 503,
}
ERRORS: dict[str, tuple[int, str]] = {
    "unauthorized": (401, "the operator key is missing or wrong"),
    "forbidden_origin": (403, "a web page of another origin, or a Host that is not local"),
    "bad_request": (400, "the body or message is not what the route expects"),
    "body_too_large": (413, f"the body is over {MAX_BODY_BYTES} bytes"),
    "unknown_question": (404, "no pending question has that id"),
}
_LOCAL_ORIGINS = Origins(local=True, own=False)
_MESSAGE_SHAPE = 'expected a JSON object {"viewer": "<name>", "text": "<question>"}'
_ACTIONS = ("message", "skip", "pin", "unpin", "queue")


def operator_key_from_environment(env: Mapping[str, str] | None = None) -> str | None:
    """The gateway's operator key ($AVATAR_GATEWAY_KEY or its _FILE); None when unset."""
    return read_secret(GATEWAY_KEY_ENV, env) or None


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _error(code: str, message: str) -> web.Response:
    status = ERRORS[code][0]
    headers = {"WWW-Authenticate": 'Bearer realm="chat"'} if status == 401 else None
    return web.json_response({"error": code, "message": message}, status=status, headers=headers)


class _ChatInput:
    """The routes' shared state: the queue and who may call."""

    def __init__(self, queue: ChatQueue, operator_key: str | None) -> None:
        self.queue, self._key = queue, operator_key

    def refusal(self, request: web.Request) -> web.Response | None:
        """None when the caller may use the chat input; else the refusal to answer."""
        if self._key is not None:
            if bearer_matches(request.headers.get("Authorization", ""), self._key):
                return None
            return _error("unauthorized", "send the operator key: Authorization: Bearer <key>")
        host, origin = request.headers.get("Host"), request.headers.get("Origin")
        if not Hosts().allows(host):
            return _error("forbidden_origin", "without an operator key only localhost is served")
        if origin and not _LOCAL_ORIGINS.allows(origin, host or ""):
            return _error("forbidden_origin", "web pages of other origins may not post questions")
        return None

    def offer(self, data: Any, source: str) -> Verdict | str:
        """A message's fields -> the queue's verdict, or what is wrong with the fields."""
        if not isinstance(data, dict):
            return _MESSAGE_SHAPE
        viewer, text = data.get("viewer"), data.get("text")
        if not isinstance(viewer, str) or not isinstance(text, str):
            return f"{_MESSAGE_SHAPE}: viewer and text must be strings"
        if len(viewer) > MAX_VIEWER_FIELD_CHARS:
            return f"the viewer name is over {MAX_VIEWER_FIELD_CHARS} characters"
        return self.queue.offer(ChatMessage(viewer, text, source, time.monotonic()))

    def act(self, action: str, question_id: int) -> bool:
        """skip, pin or unpin a pending question; False when it is not pending."""
        operator_actions = {
            "skip": self.queue.skip,
            "pin": self.queue.pin,
            "unpin": self.queue.unpin,
        }
        return operator_actions[action](question_id)


async def _read_json(request: web.Request) -> Any:
    """The body as JSON; _BodyError (with the answer to give) when it is too large or not JSON."""
    if request.content_length is not None and request.content_length > MAX_BODY_BYTES:
        raise _BodyError(_error("body_too_large", f"send at most {MAX_BODY_BYTES} bytes"))
    body = bytearray()
    while chunk := await request.content.read(MAX_BODY_BYTES + 1 - len(body)):
        body += chunk
        if len(body) > MAX_BODY_BYTES:
            raise _BodyError(_error("body_too_large", f"send at most {MAX_BODY_BYTES} bytes"))
    try:
        return json.loads(body)
    except (ValueError, RecursionError):  # RecursionError: "[[[[..." nested past the stack
        raise _BodyError(_error("bad_request", f"the body is not JSON: {_MESSAGE_SHAPE}")) from None


class _BodyError(Exception):
    def __init__(self, response: web.Response) -> None:
        self.response = response


def _verdict_response(verdict: Verdict) -> web.Response:
    return web.json_response(verdict.to_json(), status=VERDICT_STATUS[verdict.reason])


def chat_routes(
    queue: ChatQueue, operator_key: str | None, *, host: str = "127.0.0.1"
) -> list[web.RouteDef]:
    """The chat input's routes for a server bound to `host`. ValueError when there is no
    operator key and `host` is not loopback: set $AVATAR_GATEWAY_KEY (or its _FILE)."""
    if operator_key is None and not is_loopback(host):
        raise ValueError(
            f"the chat input on {host} needs an operator key: set ${GATEWAY_KEY_ENV} "
            f"or ${GATEWAY_KEY_ENV}_FILE (without one it serves only a loopback address)"
        )
    if operator_key is None:
        log.warning("chat input without an operator key: open to local callers on %s", host)
    chat = _ChatInput(queue, operator_key)

    async def post_message(request: web.Request) -> web.StreamResponse:
        if (refusal := chat.refusal(request)) is not None:
            return refusal
        try:
            data = await _read_json(request)
        except _BodyError as bad:
            return bad.response
        verdict = chat.offer(data, "http")
        if isinstance(verdict, str):
            return _error("bad_request", verdict)
        return _verdict_response(verdict)

    async def get_queue(request: web.Request) -> web.StreamResponse:
        if (refusal := chat.refusal(request)) is not None:
            return refusal
        return web.json_response(_queue_json(queue))

    async def question_action(request: web.Request) -> web.StreamResponse:
        if (refusal := chat.refusal(request)) is not None:
            return refusal
        question_id, action = int(request.match_info["id"]), request.match_info["action"]
        if not chat.act(action, question_id):
            return _error("unknown_question", f"question {question_id} is not pending")
        return web.json_response({"ok": True, "id": question_id, "action": action})

    async def websocket(request: web.Request) -> web.StreamResponse:
        if (refusal := chat.refusal(request)) is not None:
            return refusal
        ws = web.WebSocketResponse(max_msg_size=MAX_WS_MESSAGE_BYTES, heartbeat=30.0)
        await ws.prepare(request)
        async for frame in ws:
            if frame.type == WSMsgType.TEXT:
                await ws.send_json(_ws_answer(chat, frame.data))
            elif frame.type == WSMsgType.BINARY:
                await ws.send_json(_ws_error(None, "send JSON text messages, not binary"))
        return ws

    return [
        web.post("/chat/messages", post_message),
        web.get("/chat/queue", get_queue),
        web.post(r"/chat/questions/{id:\d{1,12}}/{action:skip|pin|unpin}", question_action),
        web.get("/chat/ws", websocket),
    ]


def add_chat_routes(
    app: web.Application, queue: ChatQueue, operator_key: str | None, *, host: str = "127.0.0.1"
) -> None:
    """Mount `chat_routes` on `app`."""
    app.add_routes(chat_routes(queue, operator_key, host=host))


def _queue_json(queue: ChatQueue) -> dict[str, Any]:
    return {"pending": [q.to_json() for q in queue.pending()], "counts": dict(queue.counts)}


def _ws_error(ref: Any, message: str, action: Any = None) -> dict[str, Any]:
    answer = {"action": action, "error": "bad_request", "message": message}
    return answer | ({"ref": ref} if ref is not None else {})


def _ws_answer(chat: _ChatInput, data: str) -> dict[str, Any]:
    """One WebSocket message -> its answer (never raises)."""
    shape = f'expected {{"action": one of {list(_ACTIONS)}, ...}}'
    try:
        message = json.loads(data)
    except (ValueError, RecursionError):
        return _ws_error(None, f"not JSON: {shape}")
    if not isinstance(message, dict) or message.get("action") not in _ACTIONS:
        return _ws_error(None, shape)
    action, ref = message["action"], message.get("ref")
    if ref is not None and not isinstance(ref, (str, int)):
        return _ws_error(None, "ref must be a string or an integer", action)
    echo = {"ref": ref} if ref is not None else {}
    if action == "queue":
        return {"action": action, **_queue_json(chat.queue), **echo}
    if action == "message":
        verdict = chat.offer(message, "ws")
        if isinstance(verdict, str):
            return _ws_error(ref, verdict, action)
        return {"action": action, **verdict.to_json(), **echo}
    question_id = message.get("id")
    if not isinstance(question_id, int) or isinstance(question_id, bool):
        return _ws_error(ref, f'expected {{"action": "{action}", "id": <question id>}}', action)
    if not chat.act(action, question_id):
        return {
            "action": action,
            "error": "unknown_question",
            "message": f"question {question_id} is not pending",
            **echo,
        }
    return {"action": action, "ok": True, "id": question_id, **echo}
