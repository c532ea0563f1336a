"""GPT-Live over WebRTC from a real page: headless Chromium (fake microphone) POSTs its
offer to `/v1/live/sessions` from page JavaScript, as OpenAI's browser guide does, and
reads `session.started` on its `oai-events` data channel. The server is a real
`parley serve --pipeline echo` (tests/web/test_demo_page.py has the harness)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.web.test_cli import Server
from tests.web.test_demo_page import chromium, echo_server, open_page, question_wav

__all__ = ["echo_server", "question_wav"]

START_LIVE = """
async () => {
  const pc = new RTCPeerConnection();
  const mic = await navigator.mediaDevices.getUserMedia({audio: true});
  mic.getTracks().forEach((track) => pc.addTrack(track, mic));
  const channel = pc.createDataChannel("oai-events");
  const started = new Promise((resolve, reject) => {
    channel.onmessage = (e) => {
      const event = JSON.parse(e.data);
      if (event.type === "session.started") resolve(event);
    };
    setTimeout(() => reject(new Error("no session.started in 20 s")), 20000);
  });
  await pc.setLocalDescription(await pc.createOffer());
  const response = await fetch("/v1/live/sessions", {
    method: "POST",
    headers: {"Content-Type": "application/json"},
    body: JSON.stringify({
      session: {model: "gpt-live-1", instructions: "Be brief."},
      transport: {type: "webrtc", sdp: pc.localDescription.sdp},
    }),
  });
  const answer = await response.json();
  if (response.status !== 201) throw new Error(JSON.stringify(answer));
  await pc.setRemoteDescription({type: "answer", sdp: answer.transport.sdp});
  const event = await started;
  channel.send(JSON.stringify({type: "session.close", event_id: "bye"}));
  pc.close();
  return {id: answer.session.id, started: event};
}
"""


@pytest.mark.slow
async def test_a_page_starts_a_live_session_and_reads_session_started(
    echo_server: tuple[Server, str], question_wav: Path, tmp_path: Path
) -> None:
    _, base = echo_server
    problems: list[str] = []
    async with chromium(tmp_path / "profile", question_wav) as context:
        page = await open_page(context, f"{base}/", problems)
        result: dict[str, Any] = await page.evaluate(START_LIVE)
    assert result["started"]["session"]["id"] == result["id"]
    assert result["started"]["session"]["model"] == "gpt-live-1"
    assert not problems, problems
