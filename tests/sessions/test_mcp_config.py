"""An MCP tool's settings: which listed tools are offered, which calls wait for approval,
and what session.updated echoes."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from sessions.config import SessionConfig
from sessions.mcp_config import McpToolConfig

URL = "http://127.0.0.1:9/mcp"


def server(**fields: object) -> McpToolConfig:
    return McpToolConfig.model_validate({"server_label": "w", "server_url": URL, **fields})


def test_allowed_tools_as_names_or_as_a_filter() -> None:
    assert server().allows("anything")
    assert server(allowed_tools=["a"]).allows("a") and not server(allowed_tools=["a"]).allows("b")
    read_only = server(allowed_tools={"read_only": True})
    assert read_only.allows("a", read_only=True) and not read_only.allows("a", read_only=False)
    named = server(allowed_tools={"tool_names": ["a"]})
    assert named.allows("a") and not named.allows("b")


def test_approval_is_openais_default_and_follows_the_filter() -> None:
    assert server().needs_approval("a")  # OpenAI's default: always
    assert not server(require_approval="never").needs_approval("a")
    rule = server(
        require_approval={"never": {"tool_names": ["safe"]}, "always": {"tool_names": ["x"]}}
    )
    assert not rule.needs_approval("safe") and rule.needs_approval("x")
    assert rule.needs_approval("other")  # named by neither: it waits


def test_authorization_becomes_a_bearer_header_and_is_never_echoed() -> None:
    config = server(headers={"X-Key": "k"}, authorization="tok")
    assert config.http_headers() == {"X-Key": "k", "Authorization": "Bearer tok"}
    assert config.wire()["authorization"] == "<redacted>" and config.wire()["headers"] == {
        "X-Key": "k"
    }


def test_a_session_takes_mcp_servers_and_refuses_a_bad_one() -> None:
    config = SessionConfig().updated(
        {"mcp_tools": [{"type": "mcp", "server_label": "w", "server_url": URL}]}
    )
    assert config.mcp_tools[0].server_label == "w"
    with pytest.raises(ValidationError):
        McpToolConfig.model_validate({"server_label": "w", "server_url": "ftp://x"})
