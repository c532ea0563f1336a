"""An OpenAI-compatible chat-completions server that follows a script, for the failures a
real model server will not produce on demand: a stream that stalls, a 5xx, a chunk that is
not JSON, a server that dies mid-answer, a connection refused (it stopped).

It answers as vLLM does otherwise (`/v1/models`; `/v1/chat/completions` streamed as
server-sent events, the usage last, `[DONE]`): words one at a time, `word_s` apart; with
tools, and no tool output since the last user message, a call of the first tool (its
required string arguments filled with "fake"). It counts the requests it is generating
(`running`), as vLLM's metrics do, and drops one whose client went away at its next word,
as vLLM aborts it. The contract tests (tests/pipeline/openai_chat/test_chat_contract.py)
run the same checks against it and against a real `vllm serve`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

MODEL = "scripted-chat"
ANSWER = "Paris is sunny and twenty one degrees today."


@dataclass
class Script:
    """What the next requests meet (tests change it between turns)."""

    mode: str = "answer"
    """answer | stall | status | malformed | die | error_event"""
    status: int = 503
    word_s: float = 0.02
    answer: str = ANSWER
    stall_after_words: int = 2


@dataclass
class ChatServer:
    script: Script = field(default_factory=Script)
    running: int = 0
    requests: list[dict[str, Any]] = field(default_factory=list)
    port: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/v1/models", self._models),
                Route("/v1/chat/completions", self._chat, methods=["POST"]),
            ]
        )

    async def _models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": MODEL, "object": "model"}]})

    async def _chat(self, request: Request) -> Response:
        body = await request.json()
        self.requests.append(body)
        script = self.script
        if script.mode == "status":
            error = {"error": {"message": "the model is overloaded", "type": "server_error"}}
            return JSONResponse(error, status_code=script.status)
        return StreamingResponse(self._events(request, body), media_type="text/event-stream")

    async def _events(self, request: Request, body: dict[str, Any]) -> AsyncIterator[str]:
        script = self.script
        self.running += 1
        try:
            created = int(time.time())

            def chunk(delta: dict[str, Any], finish: str | None = None) -> str:
                choice = {"index": 0, "delta": delta, "finish_reason": finish}
                payload = {"id": "chatcmpl-1", "object": "chat.completion.chunk",
                           "created": created, "model": MODEL, "choices": [choice]}  # fmt: skip
                return f"data: {json.dumps(payload)}\n\n"

            yield chunk({"role": "assistant", "content": ""})
            call = _call(body)
            words = [] if call else script.answer.split(" ")
            for index, word in enumerate(words):
                if await request.is_disconnected():
                    return  # the client went away: aborted, as vLLM does
                if script.mode == "stall" and index == script.stall_after_words:
                    await asyncio.sleep(3600)
                if script.mode == "malformed" and index == script.stall_after_words:
                    yield "data: {not json\n\n"
                    return
                if script.mode == "error_event" and index == script.stall_after_words:
                    yield 'data: {"error": {"message": "the engine died", "code": 500}}\n\n'
                    return
                if script.mode == "die" and index == script.stall_after_words:
                    raise ConnectionResetError("the server died")
                yield chunk({"content": word if index == 0 else f" {word}"})
                await asyncio.sleep(script.word_s)
            if call is not None:
                name, arguments = call
                first = {"index": 0, "id": "call_fake1", "type": "function",
                         "function": {"name": name, "arguments": ""}}  # fmt: skip
                yield chunk({"tool_calls": [first]})
                half = len(arguments) // 2
                for piece in (arguments[:half], arguments[half:]):
                    yield chunk({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]})
                yield chunk({}, "tool_calls")
            else:
                yield chunk({}, "stop")
            usage = {"prompt_tokens": 10, "completion_tokens": len(words), "total_tokens": 0}
            yield f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n"
            yield "data: [DONE]\n\n"
        finally:
            self.running -= 1


def _call(body: dict[str, Any]) -> tuple[str, str] | None:
    """The tool call a tool-using model would make now, if any."""
    tools = body.get("tools") or []
    if not tools or body.get("tool_choice") == "none":
        return None
    messages = body.get("messages") or []
    if messages and messages[-1].get("role") == "tool":
        return None  # answering with the tool's output
    function = tools[0]["function"]
    required = function.get("parameters", {}).get("required", [])
    return function["name"], json.dumps({name: "fake" for name in required})


@contextlib.asynccontextmanager
async def serving(script: Script | None = None) -> AsyncIterator[ChatServer]:
    """The server under uvicorn on a free loopback port, stopped on exit."""
    server = ChatServer(script or Script())
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        server.port = int(sock.getsockname()[1])
        config = uvicorn.Config(server.app(), log_config=None, log_level="warning", lifespan="off")
        runner = uvicorn.Server(config)
        task = asyncio.create_task(runner.serve(sockets=[sock]), name="chat-server")
        try:
            while not runner.started:
                await asyncio.sleep(0.01)
            yield server
        finally:
            runner.should_exit = True
            runner.force_exit = True
            await asyncio.wait({task}, timeout=5)
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
