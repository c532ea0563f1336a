"""`parley serve` with its Thinker on a model server that is down (the shipped `vllm` graph,
pointed at a stopped server): `/readyz` names the model server, the rest serves on. (The
spoken turns over the Realtime WebSocket: test_vllm_served.py, on a real vLLM.)"""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx

from tests.fakes.chat_server import MODEL, serving
from tests.realtime.apps import served_app
from web.settings import Settings

from .realtime_turns import graph_for

KEY = "sk-test-parley-chat"


def chat_graph(url: str, directory: Path) -> str:
    return graph_for(directory, url=url, model=MODEL, probe_s=0.2, stall_timeout_s=2)


async def test_readyz_names_the_model_server_while_it_is_down(
    tmp_path: Path, redis_url: str
) -> None:
    async with serving() as gone:
        url = gone.url
    settings = Settings(pipeline=chat_graph(url, tmp_path), api_key=KEY, max_sessions=2)
    async with served_app(settings, redis_url) as served, httpx.AsyncClient() as http:
        async with asyncio.timeout(30):
            while True:
                ready = await http.get(f"{served.http_url}/readyz")
                if ready.status_code == 503 and "thinker" in ready.json().get("down_stages", {}):
                    break
                await asyncio.sleep(0.2)
        assert url in ready.json()["down_stages"]["thinker"]
        assert (await http.get(f"{served.http_url}/healthz")).status_code == 200
