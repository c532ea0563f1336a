"""Past its slots an endpoint refuses at once with OpenAI's 429, and frees a slot when a
request ends (however it ends)."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from web.audio_rest.admission import Admission
from web.audio_rest.errors import AudioApiError


async def test_a_request_past_the_slots_gets_a_429() -> None:
    admission = Admission("speech", 2)
    async with contextlib.AsyncExitStack() as held:
        await held.enter_async_context(admission.slot())
        await held.enter_async_context(admission.slot())
        with pytest.raises(AudioApiError) as refused:
            async with admission.slot():
                pass
    assert refused.value.status == 429
    body = refused.value.response().body
    assert b'"type":"rate_limit_error"' in body and b'"code":"rate_limit_exceeded"' in body
    assert refused.value.headers == {"Retry-After": "1"}
    async with admission.slot(), admission.slot():  # both free again
        pass


async def test_a_cancelled_request_frees_its_slot() -> None:
    admission = Admission("transcription", 1)
    entered = asyncio.Event()

    async def hold() -> None:
        async with admission.slot():
            entered.set()
            await asyncio.Event().wait()

    async with asyncio.TaskGroup() as tasks:
        holder = tasks.create_task(hold())
        await entered.wait()
        with pytest.raises(AudioApiError):
            async with admission.slot():
                pass
        holder.cancel()
    async with admission.slot():
        pass
