"""Benchmark: voice to voice over the OpenAI Realtime WebSocket, as a user's microphone sees it.

Twenty questions (`loadtest.questions`), spoken by Piper's joe voice at 24 kHz PCM16 (the
WebSocket's default format), are streamed as `input_audio_buffer.append` in 20 ms chunks
paced by the clock, each chunk sent when a microphone would have captured its last sample;
between questions, and for 1.5 s after each, the microphone keeps sending low noise. The
server's own turn detection (server VAD at its default 500 ms, or semantic VAD) ends turns.

Per turn, on the client's clock: the last voiced sample (known from the audio sent), then
the arrival of `input_audio_buffer.speech_stopped`, the input transcript
(`...input_audio_transcription.completed`), the first answer text
(`response.output_audio_transcript.delta`) and the first answer audio
(`response.output_audio.delta`). Also the recogniser's word error rate against the question
text, and the Thinker's key-word hit rate on the answer's transcript.

By default all questions go in one session, each after the previous answer's audio has
ended; `--fresh` opens a session per question. Without `--url` a `parley serve` is started
in a child process (with its embedded Redis): its own event loop and processes, as a real
client would meet it, and not sharing the client's loop, whose timestamps are the
measurement.

    .venv/bin/python -m loadtest.voice_bench [--n 20] [--fresh] [--vad server|semantic]
        [--eagerness low|medium|high|auto] [--url ws://HOST:PORT] [--pipeline cascade]
        [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import sys
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from websockets.asyncio.client import ClientConnection, connect

from .questions import QUESTIONS, Question
from .served import parley_serve
from .voice_figures import Turn, figures, table
from .voice_mic import RATE, Microphone, spoken

TAIL_MS = 1500
"""Silence streamed after each question, as a microphone keeps sending."""
TURN_TIMEOUT_S = 60.0
SERVER_START_S = 120.0


class _Session:
    """One Realtime WebSocket session: the microphone task, and the events it hears back."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.mic = Microphone(ws)

    async def setup(self, vad: str, eagerness: str | None) -> None:
        await self._wait_for("session.created")
        if vad == "semantic":
            detection: dict[str, Any] = {"type": "semantic_vad"}
            if eagerness:
                detection["eagerness"] = eagerness
            audio = {"input": {"turn_detection": detection}}
            update = {"type": "session.update", "session": {"type": "realtime", "audio": audio}}
            await self.ws.send(json.dumps(update))
            await self._wait_for("session.updated")

    async def _wait_for(self, name: str) -> dict[str, Any]:
        async with asyncio.timeout(30):
            while True:
                event: dict[str, Any] = json.loads(await self.ws.recv())
                if event["type"] == "error":
                    raise RuntimeError(f"server error: {event.get('error')}")
                if event["type"] == name:
                    return event

    async def ask(self, question: Question, speech: np.ndarray) -> Turn:
        """Say `question`, then hear events until every answer it started has been played."""
        last_voiced = self.mic.say(speech, tail_ms=TAIL_MS)
        turn = Turn(question=question, last_voiced=last_voiced)
        created = done = 0
        audio_start: float | None = None
        audio_end = 0.0
        deadline = last_voiced + TURN_TIMEOUT_S
        while True:
            now = time.monotonic()
            played = audio_start is None or now >= audio_end
            if now >= self.mic.idle_at and created and done == created and played:
                turn.mic_lag_s = self.mic.max_lag_s
                return turn
            if now > deadline:
                raise TimeoutError(f"no complete answer to {question.text!r}")
            wait = max(0.02, min(self.mic.idle_at, audio_end) - now)
            try:
                async with asyncio.timeout(wait):
                    raw = await self.ws.recv()
            except TimeoutError:
                continue
            at = time.monotonic()
            event: dict[str, Any] = json.loads(raw)
            kind = event["type"]
            if kind == "error":
                raise RuntimeError(f"server error: {event.get('error')}")
            if kind == "input_audio_buffer.speech_stopped":
                if at <= last_voiced:
                    turn.early_stops += 1  # the turn was cut before the user finished
                elif turn.speech_stopped is None:
                    turn.speech_stopped = at
            elif kind == "conversation.item.input_audio_transcription.completed":
                turn.transcripts.append(event["transcript"])
                if turn.speech_stopped is not None and turn.transcribed is None:
                    turn.transcribed = at
            elif kind == "response.created":
                created += 1
            elif kind == "response.output_audio_transcript.delta":
                if turn.speech_stopped is not None and turn.first_text is None:
                    turn.first_text = at
            elif kind == "response.output_audio.delta":
                seconds = len(base64.b64decode(event["delta"])) / 2 / RATE
                turn.audio_s += seconds
                if turn.speech_stopped is not None and turn.first_audio is None:
                    turn.first_audio = at
                audio_start = at if audio_start is None else audio_start
                # Paced at real time: the answer has played once all of it would have.
                audio_end = max(at, audio_start + turn.audio_s)
            elif kind == "response.output_audio_transcript.done":
                turn.answers.append(event["transcript"])
            elif kind == "response.done":
                done += 1


@contextlib.contextmanager
def parley_server(pipeline: str) -> Iterator[str]:
    """`parley serve --pipeline PIPELINE` on a free loopback port, ready: its ws:// URL."""
    with parley_serve("--pipeline", pipeline, start_s=SERVER_START_S) as served:
        yield served.ws_url


@contextlib.asynccontextmanager
async def _session(url: str, vad: str, eagerness: str | None) -> AsyncIterator[_Session]:
    async with connect(f"{url}/v1/realtime?model=parley", proxy=None, max_size=None) as ws:
        session = _Session(ws)
        async with asyncio.TaskGroup() as group:
            await session.setup(vad, eagerness)
            mic = group.create_task(session.mic.run(), name="microphone")
            try:
                yield session
            finally:
                mic.cancel()


async def run(
    url: str,
    questions: Sequence[Question],
    fresh: bool,
    vad: str,
    eagerness: str | None,
    warm: bool = True,
) -> list[Turn]:
    speech = [spoken(q.text) for q in questions]
    if warm:  # the process's first turn loads and warms what later turns reuse
        async with _session(url, vad, eagerness) as session:
            await session.ask(Question("Hello.", frozenset()), spoken("Hello there."))
    turns: list[Turn] = []
    if fresh:
        for question, pcm in zip(questions, speech, strict=True):
            async with _session(url, vad, eagerness) as session:
                turns.append(await session.ask(question, pcm))
    else:
        async with _session(url, vad, eagerness) as session:
            for question, pcm in zip(questions, speech, strict=True):
                turns.append(await session.ask(question, pcm))
    return turns


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="voice to voice over the Realtime WebSocket")
    parser.add_argument("--n", type=int, default=20)
    parser.add_argument("--fresh", action="store_true", help="a new session per question")
    parser.add_argument("--vad", choices=("server", "semantic"), default="server")
    parser.add_argument("--eagerness", choices=("low", "medium", "high", "auto"))
    parser.add_argument("--url", help="ws://HOST:PORT of a running server; else start one")
    parser.add_argument("--pipeline", default="cascade", help="for the server started here")
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args(argv)
    mode = "fresh sessions" if args.fresh else "one session"
    vad = args.vad + (f" ({args.eagerness})" if args.eagerness else "")
    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        url = args.url or stack.enter_context(parley_server(args.pipeline))
        questions = [QUESTIONS[i % len(QUESTIONS)] for i in range(args.n)]
        turns = asyncio.run(run(url, questions, args.fresh, args.vad, args.eagerness))
    results = figures(turns)
    results["wall_s"] = round(time.monotonic() - started, 1)
    title = f"voice to voice over the WebSocket: {args.n} questions, {mode}, {vad} VAD"
    print(table(title, results))
    if args.json:
        info = {"mode": mode, "vad": vad, "pipeline": args.pipeline, "date": time.ctime()}
        args.json.write_text(json.dumps({**info, **results}, indent=2) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
