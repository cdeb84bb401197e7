"""The anchor's calls to Triton: `say` (the served `avatar_say`: text -> speech and face, for
whose question it answers), `answer` (a turn of the served `avatar` model through the
gateway's typed client, in the broadcast's one conversation) and `render` (ARKit-52 weights
and head poses -> frames by the served `portrait_renderer` or cartoon `renderer`)."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import Any

import numpy as np

from avatar.conversation_tokens import NEW_SESSION
from avatar.model_io import AVATAR_SAY, RENDERERS, infer_inputs
from gateway.triton_client import TritonClient, TurnCall

log = logging.getLogger(__name__)

RENDER_BATCH = 16  # the renderers' max_batch_size


@dataclasses.dataclass(frozen=True)
class Speech:
    """Audio at `sample_rate` and ARKit-52 weights [T, 52] at `fps`."""

    audio: np.ndarray
    sample_rate: int
    blendshapes: np.ndarray
    fps: float


class Anchor:
    """`client`: tritonclient.grpc.aio.InferenceServerClient; `headers`: the operator's
    access (gateway.triton_client.TritonAccess.headers); `controls`: the `avatar` model's
    controls for every answer (avatar.pipeline.request.Controls: fps, max_tokens, persona)."""

    def __init__(
        self,
        client: Any,
        *,
        headers: Mapping[str, str] | None = None,
        face: str = "portrait",
        controls: Mapping[str, Any] | None = None,
    ) -> None:
        if face not in RENDERERS:
            raise ValueError(f"face={face!r}: expected one of {sorted(RENDERERS)}")
        self.client, self.headers = client, dict(headers or {})
        self.render_io = RENDERERS[face]
        self.renderer = self.render_io.model
        self.turns = TritonClient(client, headers=headers)
        self.controls = dict(controls or {})
        # the broadcast's one conversation: the server's token, once the first turn made it
        self.session = NEW_SESSION

    async def ready(self) -> list[str]:
        """The models the show needs that Triton does not report ready."""
        models = ("avatar", "avatar_say", self.renderer)
        return [m for m in models if not await self.client.is_model_ready(m, headers=self.headers)]

    async def say(self, text: str) -> Speech:
        """`text` spoken by the served `avatar_say` (one call, non-streaming)."""
        import tritonclient.grpc.aio as grpcclient

        result = await self.client.infer(
            AVATAR_SAY.model,
            infer_inputs(AVATAR_SAY.request(text=text), grpcclient.InferInput),
            outputs=[grpcclient.InferRequestedOutput(n) for n in AVATAR_SAY.outputs],
            headers=self.headers,
        )
        values = AVATAR_SAY.read_response({n: result.as_numpy(n) for n in AVATAR_SAY.outputs})
        return Speech(
            values["audio"], int(values["sample_rate"]), values["blendshapes"], values["fps"]
        )

    def answer(self, text: str) -> TurnCall:
        """A turn of the `avatar` model answering `text` in the broadcast's conversation
        (the caller reads its events and passes the final's token to `remember`)."""
        return self.turns.turn(
            audio=None,
            text=text,
            session_id=self.session,
            parent_session_id="",
            controls=self.controls,
            session=self.session if self.session != NEW_SESSION else "",
        )

    def remember(self, token: str) -> None:
        """The session token a turn's final sent: the next answers continue it."""
        if token:
            self.session = token

    async def render(self, blendshapes: np.ndarray, head_pose: np.ndarray) -> np.ndarray:
        """Frames [T, H, W, 3] uint8 for weights [T, 52] and poses [T, 3], in requests of at
        most the renderer's batch."""
        import tritonclient.grpc.aio as grpcclient

        io, chunks = self.render_io, []
        for start in range(0, len(blendshapes), RENDER_BATCH):
            rows = slice(start, start + RENDER_BATCH)
            tensors = io.rows(blendshapes=blendshapes[rows], head_pose=head_pose[rows])
            result = await self.client.infer(
                io.model,
                infer_inputs(tensors, grpcclient.InferInput),
                outputs=[grpcclient.InferRequestedOutput(n) for n in io.outputs],
                headers=self.headers,
            )
            chunks.append(io.read_rows({n: result.as_numpy(n) for n in io.outputs})["frames"])
        return np.concatenate(chunks)
