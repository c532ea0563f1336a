"""Pipecat 1.14.0 bot: SmallWebRTCTransport in, a user-turn aggregator (Silero VAD from the
package, interruptions on VAD speech start, end of turn after Pipecat's speech timeout, no
transcript wait), a player that answers every finished turn with the fixed reply (reply.py)
as TTS audio frames in 100 ms pieces, SmallWebRTCTransport out. Offers: `POST /api/offer`.

    ~/.cache/parley/peers/pipecat/bin/python -m loadtest.peers.bots.pipecat_bot
Env: PORT, PROBE_PORT (probe.py), REPLY_S.
"""

# mypy: allow-subclassing-any, allow-untyped-decorators
# The framework lives in its own venv: mypy may or may not find it where it runs.

from __future__ import annotations

import os
import sys
from typing import Any

import uvicorn  # type: ignore[import-not-found, unused-ignore]
from fastapi import BackgroundTasks, FastAPI  # type: ignore[import-not-found, unused-ignore]
from loguru import logger  # type: ignore[import-not-found, unused-ignore]
from pipecat.audio.vad.silero import SileroVADAnalyzer  # type: ignore[import-not-found, unused-ignore]
from pipecat.frames.frames import (  # type: ignore[import-not-found, unused-ignore]
    TTSAudioRawFrame,
    TTSStartedFrame,
    TTSStoppedFrame,
    UserStoppedSpeakingFrame,
)
from pipecat.pipeline.pipeline import Pipeline  # type: ignore[import-not-found, unused-ignore]
from pipecat.pipeline.runner import PipelineRunner  # type: ignore[import-not-found, unused-ignore]
from pipecat.pipeline.task import PipelineParams, PipelineTask  # type: ignore[import-not-found, unused-ignore]
from pipecat.processors.aggregators.llm_context import LLMContext  # type: ignore[import-not-found, unused-ignore]
from pipecat.processors.aggregators.llm_response_universal import (  # type: ignore[import-not-found, unused-ignore]
    LLMUserAggregator,
    LLMUserAggregatorParams,
)
from pipecat.processors.frame_processor import (  # type: ignore[import-not-found, unused-ignore]
    FrameDirection,
    FrameProcessor,
)
from pipecat.transports.base_transport import TransportParams  # type: ignore[import-not-found, unused-ignore]
from pipecat.transports.smallwebrtc.request_handler import (  # type: ignore[import-not-found, unused-ignore]
    SmallWebRTCRequest,
    SmallWebRTCRequestHandler,
)
from pipecat.transports.smallwebrtc.transport import (  # type: ignore[import-not-found, unused-ignore]
    SmallWebRTCTransport,
)
from pipecat.turns.user_start import VADUserTurnStartStrategy  # type: ignore[import-not-found, unused-ignore]
from pipecat.turns.user_stop import (  # type: ignore[import-not-found, unused-ignore]
    SpeechTimeoutUserTurnStopStrategy,
)
from pipecat.turns.user_turn_strategies import UserTurnStrategies  # type: ignore[import-not-found, unused-ignore]

from loadtest.peers import probe  # loopback ICE and the frame clock
from loadtest.peers.bots.reply import RATE, pieces, reply_seconds, sweep

PIECES = [piece.tobytes() for piece in pieces(sweep(reply_seconds()))]


class Answer(FrameProcessor):
    """On the end of a user turn, pushes the reply downstream as a TTS service would."""

    async def process_frame(self, frame: Any, direction: Any) -> None:
        await super().process_frame(frame, direction)
        await self.push_frame(frame, direction)
        if isinstance(frame, UserStoppedSpeakingFrame) and direction == FrameDirection.DOWNSTREAM:
            await self.push_frame(TTSStartedFrame())
            for piece in PIECES:
                await self.push_frame(
                    TTSAudioRawFrame(audio=piece, sample_rate=RATE, num_channels=1)
                )
            await self.push_frame(TTSStoppedFrame())


async def run_bot(connection: Any) -> None:
    transport = SmallWebRTCTransport(
        webrtc_connection=connection,
        params=TransportParams(audio_in_enabled=True, audio_out_enabled=True),
    )
    strategies = UserTurnStrategies(
        start=[VADUserTurnStartStrategy(enable_interruptions=True)],
        stop=[SpeechTimeoutUserTurnStopStrategy(wait_for_transcript=False)],
    )
    turns = LLMUserAggregator(
        LLMContext(),
        params=LLMUserAggregatorParams(
            vad_analyzer=SileroVADAnalyzer(), user_turn_strategies=strategies, empty_user_turn=None
        ),
    )
    pipeline = Pipeline([transport.input(), turns, Answer(), transport.output()])
    task = PipelineTask(pipeline, params=PipelineParams(audio_out_sample_rate=RATE))

    @transport.event_handler("on_client_disconnected")
    async def hung_up(transport: Any, client: Any) -> None:
        await task.cancel()

    await PipelineRunner(handle_sigint=False).run(task)


def app() -> FastAPI:
    served = FastAPI()
    handler = SmallWebRTCRequestHandler(ice_servers=[])

    @served.post("/api/offer")
    async def offer(body: dict[str, Any], background: BackgroundTasks) -> Any:
        async def start(connection: Any) -> None:
            background.add_task(run_bot, connection)

        return await handler.handle_web_request(SmallWebRTCRequest.from_dict(body), start)

    return served


if __name__ == "__main__":
    probe.install_from_env()
    logger.remove()
    logger.add(sys.stderr, level="WARNING")
    uvicorn.run(app(), host="127.0.0.1", port=int(os.environ["PORT"]), log_level="warning")
