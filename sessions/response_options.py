"""What one `response.create` asks of its answer, beyond the session's settings.

OpenAI lets a client shape a single response: other instructions, text only, its own
tools, a token cap, and out-of-band answers that do not join the conversation
(`conversation: "none"`), optionally over their own `input` items instead of the
conversation. `ResponseOptions` carries those choices from the transport to the session;
every field left None falls back to the session's setting when the response starts
(`resolve`), so a later `session.update` never changes an answer already running.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from pipeline.types import RecognitionHints

from .config import SessionConfig, ToolConfig, TruncationConfig, check_tool_choice
from .errors import InvalidRequestError
from .events import ConversationItem
from .recognition_hints import recognition_hints

Modality = Literal["audio", "text"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ResponseOptions:
    instructions: str | None = None
    output_modalities: tuple[Modality, ...] | None = None
    metadata: dict[str, str] | None = None
    tools: tuple[ToolConfig, ...] | None = None
    tool_choice: str | None = None
    max_output_tokens: int | None = None
    """None: the session's cap; OpenAI's "inf" arrives here as the session's too."""
    voice: str | None = None
    speed: float | None = None
    in_conversation: bool = True
    """False for `conversation: "none"`: the answer's items stay out of the history."""
    input: tuple[ConversationItem, ...] | None = None
    """The response's own context instead of the conversation's (an empty tuple: none)."""

    def resolve(
        self, config: SessionConfig, mcp_tools: tuple[ToolConfig, ...] = ()
    ) -> ResolvedOptions:
        """These options over `config`; raises InvalidRequestError for a tool_choice that
        names no tool of the response. `mcp_tools`: the session's MCP servers' tools."""
        tools = self.tools if self.tools is not None else config.tools
        choice = self.tool_choice if self.tool_choice is not None else config.tool_choice
        try:
            check_tool_choice(choice, tools + mcp_tools)
        except ValueError as exc:
            raise InvalidRequestError(f"response.tool_choice: {exc}", "invalid_value") from None
        modalities = self.output_modalities or config.output_modalities
        return ResolvedOptions(
            instructions=self.instructions
            if self.instructions is not None
            else config.instructions,
            audio_output="audio" in modalities,
            metadata=self.metadata,
            tools=tools,
            mcp_tools=mcp_tools,
            tool_choice=choice,
            max_output_tokens=self.max_output_tokens or config.max_output_tokens,
            voice=self.voice or config.voice,
            speed=self.speed if self.speed is not None else config.speed,
            in_conversation=self.in_conversation,
            input=self.input,
            truncation=config.truncation,
            recognition=recognition_hints(config),
            parallel_tool_calls=config.parallel_tool_calls,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class ResolvedOptions:
    """A response's settings, fixed when it starts."""

    instructions: str
    audio_output: bool
    metadata: dict[str, str] | None
    tools: tuple[ToolConfig, ...]
    tool_choice: str
    max_output_tokens: int | None
    voice: str
    speed: float
    in_conversation: bool
    input: tuple[ConversationItem, ...] | None
    truncation: TruncationConfig = "auto"
    """The session's `truncation`: how the engine cuts a conversation longer than its
    context (a response has no setting of its own)."""
    recognition: RecognitionHints = field(default_factory=RecognitionHints)
    """The session's language and prompt for recognising the turn's audio."""
    mcp_tools: tuple[ToolConfig, ...] = ()
    """The tools the session's MCP servers listed, offered after `tools` (mcp_tools.py)."""
    parallel_tool_calls: bool = True
    """The session's `parallel_tool_calls`: False, at most one call a round of writing."""
