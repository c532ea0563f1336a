"""The pipeline request of one answer: the turn, its context, and the response's options.

An answer hears its turn (the user's audio, or a typed question) and sees the conversation
before it: messages as text, function calls and their outputs as such, so a model that
called a tool reads the result it asked for. An out-of-band answer with its own `input`
sees only those items. Camera frames come from the turn's own moment (frame_window.py):
from just before its audio began to its commit, or, for a typed turn, the moment before
the answer starts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import numpy as np

from pipeline.types import HistoryItem, ItemKind, PipelineRequest, ToolSpec, Truncation, VideoFrame

from .config import TruncationConfig
from .events import ConversationItem
from .frame_window import FrameWindow, turn_window
from .mcp_history import mcp_history
from .metrics import SessionMetrics
from .response_options import ResolvedOptions
from .store import SessionStore
from .turns import TurnAudio, TurnInput, Turns


def history_item(item: ConversationItem) -> HistoryItem:
    return HistoryItem(
        role=item.role,
        text=item.text,
        item_id=item.id,
        kind=cast(ItemKind, item.type),
        name=item.name,
        call_id=item.call_id,
        arguments=item.arguments,
    )


def prompt_history(items: Sequence[ConversationItem]) -> tuple[HistoryItem, ...]:
    """The conversation as the model reads it (MCP items as mcp_history.py shows them)."""
    requests = {item.id: item for item in items if item.type == "mcp_approval_request"}
    prompt: list[HistoryItem] = []
    for item in items:
        if item.type.startswith("mcp_"):
            prompt += mcp_history(item, requests)
        elif _in_prompt(item):
            prompt.append(history_item(item))
    return tuple(prompt)


def _in_prompt(item: ConversationItem) -> bool:
    """Messages with words, and every function call and output (an empty output still
    answers its call)."""
    return item.type != "message" or bool(item.text)


class RequestBuilder:
    """Builds a session's requests; it reads the session's store and turns, never writes."""

    def __init__(
        self, session_id: str, store: SessionStore, turns: Turns, metrics: SessionMetrics
    ) -> None:
        self.session_id = session_id
        self._store = store
        self._turns = turns
        self._metrics = metrics

    async def build_ahead(
        self,
        request_id: str,
        item_id: str,
        audio_ms: tuple[int, int],
        transcript: str,
        options: ResolvedOptions,
        output_sample_rate: int,
        streamed_turn: str = "",
    ) -> PipelineRequest:
        """The request of a turn that is still open (prefetch.py): its speech so far,
        already recognised, after the whole conversation; `streamed_turn`: the turn as
        streamed to the pipeline while the user spoke (streamed_turn.py), if it was."""
        items = await self._store.history.items()
        pcm = await self._store.audio.read(*audio_ms)
        return PipelineRequest(
            request_id=request_id,
            session_id=self.session_id,
            item_ids=(*(item.id for item in items), item_id),
            audio=pcm,
            transcript=transcript,
            frames=tuple(await self._store.frames.sample(window=self._window_ahead(audio_ms))),
            history=prompt_history(items),
            streamed_turn=streamed_turn,
            **_options(options, output_sample_rate),
        )

    async def build_context(
        self, request_id: str, item_id: str, options: ResolvedOptions, output_sample_rate: int
    ) -> PipelineRequest:
        """What the request of the spoken turn `item_id`, just begun, will be without its
        audio: the conversation before it and the options (streamed_turn.py). Built as
        `build` builds the turn's request once it is committed, so that an engine that
        prefills the turn while it is spoken finds the same prompt at its end."""
        items = await self._store.history.items()
        return PipelineRequest(
            request_id=request_id,
            session_id=self.session_id,
            item_ids=(*(item.id for item in items if item.id != item_id), item_id),
            audio=np.zeros(0, dtype=np.int16),
            history=prompt_history([item for item in items if item.id != item_id]),
            **_options(options, output_sample_rate),
        )

    async def build(
        self,
        request_id: str,
        turn: TurnInput,
        options: ResolvedOptions,
        output_sample_rate: int,
        transcript: str | None = None,
        streamed_turn: str = "",
    ) -> PipelineRequest:
        """The turn's audio and text, the history before it, and the sampled frames;
        `transcript`: the words of the turn's audio, if they are known already;
        `streamed_turn`: the turn as streamed while the user spoke, if it was."""
        pcm = np.zeros(0, dtype=np.int16)
        text: str | None = None
        if options.input is not None:  # an out-of-band answer over its own items
            items = list(options.input)
            last = items[-1] if items else None
            if last is not None and last.role == "user" and last.type == "message":
                text = last.text
                items.pop()
            history = prompt_history(items)
            item_ids = tuple(item.id for item in options.input)
            frames: tuple[VideoFrame, ...] = ()
        else:
            items = await self._store.history.items()
            audio = self._turns.claim_audio(turn)
            if audio is not None:
                try:
                    pcm = await self._store.audio.read(audio.begin_ms, audio.end_ms)
                except Exception:
                    self._metrics.redis_errors.inc()
                    raise
            text_id = turn.text_item_id(audio)
            if text_id:
                text = next((item.text for item in items if item.id == text_id), None)
            this_turn = turn.item_ids
            history = prompt_history([item for item in items if item.id not in this_turn])
            earlier = tuple(item.id for item in items if item.id not in this_turn)
            present = {item.id for item in items}
            item_ids = earlier + tuple(i for i in this_turn if i in present)
            frames = tuple(await self._store.frames.sample(window=self._window(audio)))
        return PipelineRequest(
            request_id=request_id,
            session_id=self.session_id if options.in_conversation else "",
            item_ids=item_ids,
            audio=pcm,
            transcript=transcript if len(pcm) else None,
            text=text,
            frames=frames,
            history=history,
            streamed_turn=streamed_turn if len(pcm) else "",
            **_options(options, output_sample_rate),
        )

    def _window(self, audio: TurnAudio | None) -> FrameWindow | None:
        """The frames' window of a committed turn with `audio` (None: a typed turn, asked
        now); None where the session samples the whole cache."""
        if self._store.frames.config.frame_window == "cache":
            return None
        if audio is None:
            now = self._turns.arrivals.now_ms()
            return turn_window(now, now)
        return turn_window(audio.arrived_ms, audio.committed_ms)

    def _window_ahead(self, audio_ms: tuple[int, int]) -> FrameWindow | None:
        """The frames' window of a turn still open, with the audio `audio_ms` so far."""
        if self._store.frames.config.frame_window == "cache":
            return None
        arrivals = self._turns.arrivals
        return turn_window(arrivals.at(audio_ms[0]), arrivals.now_ms())


def _options(options: ResolvedOptions, output_sample_rate: int) -> dict[str, Any]:
    """The request's fields that come from the response's options."""
    return {
        "instructions": options.instructions,
        "output_sample_rate": output_sample_rate,
        "output_text_only": not options.audio_output,
        "tools": tuple(
            ToolSpec(tool.name, tool.description, dict(tool.parameters))
            for tool in (*options.tools, *options.mcp_tools)
        ),
        "tool_choice": options.tool_choice,
        "parallel_tool_calls": options.parallel_tool_calls,
        "max_output_tokens": options.max_output_tokens,
        "voice": "" if options.voice == "default" else options.voice,
        "speed": options.speed,
        "truncation": pipeline_truncation(options.truncation),
        "recognition": options.recognition,
    }


def pipeline_truncation(config: TruncationConfig) -> Truncation:
    """The session's `truncation` as the engines take it."""
    if isinstance(config, str):
        return Truncation(type=config)
    limits = config.token_limits
    return Truncation(
        type="retention_ratio",
        retention_ratio=config.retention_ratio,
        post_instructions_tokens=limits.post_instructions if limits is not None else None,
    )
