"""The caller's side of one request: an asyncio queue of chunks the engine loop fills."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from server.engine.interface import RequestHandle, TokenChunk


class QueueHandle(RequestHandle):
    def __init__(self, request_id: str, prompt_token_ids: tuple[int, ...]) -> None:
        self.request_id = request_id
        self.prompt_token_ids = prompt_token_ids
        self.queue: asyncio.Queue[TokenChunk] = asyncio.Queue()

    async def outputs(self) -> AsyncIterator[TokenChunk]:
        while True:
            chunk = await self.queue.get()
            # A slow consumer gets what piled up as one message, not one message per token.
            while chunk.finish is None and not self.queue.empty():
                chunk = chunk.merge(self.queue.get_nowait())
            yield chunk
            if chunk.finish is not None:
                return
