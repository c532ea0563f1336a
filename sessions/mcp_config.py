"""A remote MCP server as a session's tool: OpenAI's `{"type": "mcp", ...}` tool.

Parley is the MCP client (the official `mcp` SDK, streamable HTTP): it lists the server's
tools when the session gets the tool, offers them to the model beside the function tools,
and calls the server when the model calls one. `allowed_tools` narrows what is offered
(a list of names, or the filter form with `tool_names`; `read_only` is matched against the
tool's `readOnlyHint` annotation); `require_approval` says which calls wait for the
client's `mcp_approval_response` (`always`, `never`, or the per-tool filter form).
`server_description` goes with each of its tools' descriptions to the model.
`connector_id` (OpenAI's hosted connectors) and `tunnel_id` (its Secure MCP Tunnel) are not
served: there is no connector or tunnel here (realtime/openai/session_fields.py refuses them).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

MCP_DEADLINE_S = 10.0
"""How long one listing or one call may take, connecting included; past it the listing or
the call fails with that reason and the conversation goes on."""
MAX_MCP_SERVERS = 8


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class McpToolFilter(_Model):
    """OpenAI's filter form: tool names, and/or only tools that say they are read-only."""

    tool_names: tuple[str, ...] | None = None
    read_only: bool | None = None

    def matches(self, name: str, read_only: bool) -> bool:
        if self.tool_names is not None and name not in self.tool_names:
            return False
        return self.read_only is None or self.read_only == read_only


class McpApprovalFilter(_Model):
    always: McpToolFilter | None = None
    never: McpToolFilter | None = None


class McpToolConfig(_Model):
    """One MCP server the model may use, as the client configured it."""

    type: Literal["mcp"] = "mcp"
    server_label: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    server_url: str = Field(pattern=r"^https?://")
    headers: dict[str, str] | None = None
    authorization: str | None = None
    """Sent as `Authorization: Bearer ...` (OpenAI's OAuth access token field)."""
    allowed_tools: tuple[str, ...] | McpToolFilter | None = None
    require_approval: Literal["always", "never"] | McpApprovalFilter | None = "always"
    """OpenAI's default is `always`: a call waits for the client's approval."""
    server_description: str | None = None
    """Shown to the model with each of the server's tools (mcp_tools.py)."""
    defer_loading: Literal[False] | None = None
    """OpenAI's tool search is not here: every tool is loaded (`true` is refused)."""
    allowed_callers: tuple[Literal["direct", "programmatic"], ...] | None = None
    """Who may call the tools: the model calls them directly here, so the list must name
    `direct` (`programmatic` has no caller here and grants nothing more)."""

    @field_validator("allowed_callers")
    @classmethod
    def _direct(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if value is not None and "direct" not in value:
            raise ValueError("Parley's model calls MCP tools directly: name 'direct'")
        return value

    def http_headers(self) -> dict[str, str]:
        headers = dict(self.headers or {})
        if self.authorization:
            headers["Authorization"] = f"Bearer {self.authorization}"
        return headers

    def allows(self, name: str, read_only: bool = False) -> bool:
        allowed = self.allowed_tools
        if allowed is None:
            return True
        if isinstance(allowed, McpToolFilter):
            return allowed.matches(name, read_only)
        return name in allowed

    def needs_approval(self, name: str, read_only: bool = False) -> bool:
        """`always` unless `never`; in the filter form a tool `never` names runs at once,
        one `always` names waits, and one neither names waits (OpenAI's default)."""
        rule = self.require_approval
        if rule is None or rule == "always":
            return True
        if rule == "never":
            return False
        return not (rule.never is not None and rule.never.matches(name, read_only))

    def wire(self) -> dict[str, Any]:
        """As echoed in session.updated: the authorization is never sent back."""
        body = self.model_dump(mode="json", exclude_none=True)
        if "authorization" in body:
            body["authorization"] = "<redacted>"
        return body
