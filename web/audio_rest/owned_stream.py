"""A streamed response that owns what its body needs: the generator and the admission slot.

Starlette runs a StreamingResponse's body after the route has returned, and on a client's
disconnect cancels it wherever it is, which may leave the body's generator suspended and
unclosed (finalised later by the garbage collector, with its model run and its slot held
until then). This response closes both itself, whatever way the body ends: the generator
first (its `finally` stops the model work), then the resources the route handed over.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send


class OwnedStream(StreamingResponse):
    def __init__(
        self,
        body: AsyncGenerator[bytes, None],
        held: contextlib.AsyncExitStack,
        *,
        media_type: str,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(body, media_type=media_type, headers=headers)
        self._body = body
        self._held = held

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            try:
                await self._body.aclose()
            finally:
                await self._held.aclose()
