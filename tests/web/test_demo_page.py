"""The demo page (web/static/) in a real Chromium, against a real `parley serve`.

Chromium's fake devices stand in for the person: its microphone plays a WAV we speak with
espeak-ng at test time (a question, then silence; Chromium loops the file), its camera is a
test pattern and its permission prompts are answered yes. The server runs the echo
pipeline, which answers each turn with the user's own voice, so an audible answer is
guaranteed without any model.

The browser is Debian's `chromium` (never one downloaded by `playwright install`), which
`make test` installs; a machine without it fails here rather than skipping the page.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
import wave
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from playwright.async_api import BrowserContext, ConsoleMessage, Page, async_playwright, expect

from loadtest.speech import silence, speak, trim_silence
from tests.web.test_cli import Server, free_port, redis_children

CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
QUESTION = "Hello Parley. What is the weather like in Paris today?"
WAV_RATE = 48_000
READY_TIMEOUT_S = 60.0
WAIT_MS = 60_000  # generous: a loaded CI machine, a cold Chromium


@pytest.fixture(autouse=True)
def _chromium_installed() -> None:
    assert CHROMIUM.exists(), "Debian's chromium is missing: apt-get install chromium"


def chromium_args(wav: Path) -> list[str]:
    return [
        "--use-fake-ui-for-media-stream",
        "--use-fake-device-for-media-stream",
        f"--use-file-for-fake-audio-capture={wav}",
        "--allow-loopback-in-peer-connection",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--no-first-run",
        "--disable-sync",
    ]


@pytest.fixture
def question_wav(tmp_path: Path) -> Path:
    """A spoken question as 48 kHz 16-bit mono: 1 s of silence before it, 3 s after."""
    speech = trim_silence(speak(QUESTION, rate=WAV_RATE))
    pcm = np.concatenate([silence(1_000, WAV_RATE), speech, silence(3_000, WAV_RATE)])
    path = tmp_path / "question.wav"
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(WAV_RATE)
        out.writeframes(pcm.astype("<i2").tobytes())
    return path


@pytest.fixture
def backchannel_wav(tmp_path: Path) -> Path:
    """The question, then "Yeah." about a second into its (echoed) answer, then silence."""
    speech = trim_silence(speak(QUESTION, rate=WAV_RATE))
    yeah = trim_silence(speak("Yeah.", rate=WAV_RATE))
    pcm = np.concatenate(
        [silence(1_000, WAV_RATE), speech, silence(1_800, WAV_RATE), yeah, silence(9_000, WAV_RATE)]
    )
    path = tmp_path / "backchannel.wav"
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(WAV_RATE)
        out.writeframes(pcm.astype("<i2").tobytes())
    return path


def _start(*args: str) -> Iterator[tuple[Server, str]]:
    """`parley serve --pipeline echo` on a free port, ready; stopped (and its Redis) after."""
    port = free_port()
    server = Server("--port", str(port), "--pipeline", "echo", *args)
    base = f"http://127.0.0.1:{port}"
    try:
        server.wait_for_line("Parley is ready", timeout=READY_TIMEOUT_S)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{base}/readyz", timeout=2.0).status_code == 200:
                    break
            if time.monotonic() > deadline:
                pytest.fail(f"/readyz never turned 200; output:\n{''.join(server.output)}")
            time.sleep(0.1)
        yield server, base
    finally:
        helpers = redis_children(server.proc.pid)  # found before the server is reaped
        if server.proc.poll() is None:
            server.proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                server.proc.wait(10)
        for pid in helpers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        server.stop()


@pytest.fixture
def echo_server() -> Iterator[tuple[Server, str]]:
    yield from _start()


@pytest.fixture
def keyed_server() -> Iterator[tuple[Server, str]]:
    yield from _start("--api-key", "the-right-key")


@contextlib.asynccontextmanager
async def chromium(profile: Path, wav: Path) -> AsyncIterator[BrowserContext]:
    """Headless Debian Chromium with fake media devices and a fresh profile."""
    async with async_playwright() as pw:
        context = await pw.chromium.launch_persistent_context(
            str(profile),
            executable_path=str(CHROMIUM),
            headless=True,
            args=chromium_args(wav),
            viewport={"width": 1366, "height": 900},
        )
        try:
            yield context
        finally:
            await context.close()


async def open_page(context: BrowserContext, url: str, problems: list[str]) -> Page:
    page = context.pages[0] if context.pages else await context.new_page()
    page.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))

    def console(msg: ConsoleMessage) -> None:
        if msg.type == "error":
            problems.append(f"console error: {msg.text}")

    page.on("console", console)
    await page.goto(url)
    return page


async def sessions(base: str) -> int:
    async with httpx.AsyncClient() as client:
        ready = await client.get(f"{base}/readyz")
    return int(ready.json()["sessions"])


@pytest.mark.timeout(240)
@pytest.mark.slow
async def test_a_spoken_question_is_answered_aloud_in_the_page(
    echo_server: tuple[Server, str], question_wav: Path, tmp_path: Path
) -> None:
    server, base = echo_server
    problems: list[str] = []
    async with chromium(tmp_path / "profile", question_wav) as context:
        page = await open_page(context, f"{base}/", problems)
        await expect(page.locator("#server")).to_have_attribute("data-state", "ready")
        await page.click("#connect")
        try:
            await expect(page.locator("#status")).to_have_attribute(
                "data-state", "connected", timeout=WAIT_MS
            )
            # The echo answers with our own voice: the answer's line fills in, and the
            # received audio rises clearly above silence at some point.
            await page.wait_for_function(
                """() => [...document.querySelectorAll('#transcript > .assistant .text')]
                        .some((t) => t.textContent.trim().length > 0)""",
                timeout=WAIT_MS,
            )
            await page.wait_for_function(
                "() => Number(document.getElementById('remote-level').dataset.maxLevel) > 0.01",
                timeout=WAIT_MS,
            )
            await page.wait_for_function(
                "() => document.querySelectorAll('#latency li').length > 0", timeout=WAIT_MS
            )
        except Exception:
            await page.screenshot(path=str(tmp_path / "demo-page-failed.png"), full_page=True)
            _keep(tmp_path / "demo-page-failed.png")
            events = await page.locator("#events").inner_text()
            raise AssertionError(
                f"status {await page.locator('#status').inner_text()!r}, "
                f"error {await page.locator('#error').inner_text()!r}, problems {problems}\n"
                f"events:\n{events}\nserver output:\n{''.join(server.output)}"
            ) from None

        assert await page.locator("#transcript > .user").count() >= 1
        latency_ms = int(await page.locator("#latency li").first.get_attribute("data-ms") or -1)
        assert 0 < latency_ms < 10_000, latency_ms
        assert await page.locator("#error").is_hidden(), await page.locator("#error").inner_text()
        assert await sessions(base) == 1

        shot = tmp_path / "demo-page.png"
        await page.screenshot(path=str(shot), full_page=True)
        _keep(shot)

        await page.click("#hangup")
        await expect(page.locator("#status")).to_have_attribute("data-state", "ended")
        await expect(page.locator("#connect")).to_be_enabled()
        deadline = time.monotonic() + 10
        while await sessions(base) != 0:
            assert time.monotonic() < deadline, "the hang-up did not end the session"
            await page.wait_for_timeout(100)
    assert not problems, problems


@pytest.mark.timeout(120)
@pytest.mark.slow
async def test_a_wrong_api_key_is_a_readable_error(
    keyed_server: tuple[Server, str], question_wav: Path, tmp_path: Path
) -> None:
    _server, base = keyed_server
    problems: list[str] = []
    async with chromium(tmp_path / "profile", question_wav) as context:
        page = await open_page(context, f"{base}/", problems)
        await page.click("summary:has-text('Connection')")
        await page.fill("#api-key", "a-wrong-key")
        await page.click("#connect")
        error = page.locator("#error")
        await expect(error).to_be_visible(timeout=WAIT_MS)
        await expect(error).to_have_attribute("data-code", "unauthorized")
        await expect(error).to_contain_text("401")
        await expect(error).to_contain_text("API key")
        await expect(page.locator("#status")).to_have_attribute("data-state", "failed")
        await expect(page.locator("#connect")).to_be_enabled()
        await expect(page.locator("#hangup")).to_be_disabled()
        assert await sessions(base) == 0
    # The browser logs the refused request itself; nothing else may go wrong in the page.
    assert not [p for p in problems if "401" not in p], problems


ANSWER_LINES = "() => document.querySelectorAll('#transcript > .assistant').length"


@pytest.mark.timeout(240)
@pytest.mark.slow
async def test_the_page_re_attaches_its_call_when_the_connection_drops(
    echo_server: tuple[Server, str], question_wav: Path, tmp_path: Path
) -> None:
    server, base = echo_server
    problems: list[str] = []
    async with chromium(tmp_path / "profile", question_wav) as context:
        page = await open_page(context, f"{base}/", problems)
        offered_with: list[str] = []  # each offer's secret: a re-attach mints a fresh one

        async def note_secret(route: Any) -> None:
            offered_with.append(route.request.headers.get("authorization", ""))
            await route.continue_()

        await page.route("**/v1/realtime/calls", note_secret)
        await expect(page.locator("#server")).to_have_attribute("data-state", "ready")
        await page.click("#connect")
        status, info = page.locator("#status"), page.locator("#call-info")
        try:
            await expect(status).to_have_attribute("data-state", "connected", timeout=WAIT_MS)
            await page.wait_for_function(f"{ANSWER_LINES} >= 1", timeout=WAIT_MS)
            before = await info.inner_text()  # "call rtc_… · session sess_…"
            answers = await page.evaluate(ANSWER_LINES)
            await page.evaluate("window.parleyDemo.dropConnection()")
            await expect(info).not_to_have_text(before, timeout=WAIT_MS)
            await expect(status).to_have_attribute("data-state", "connected", timeout=WAIT_MS)
            # The microphone's file loops: the same session hears the question again and
            # answers on the new connection.
            await page.wait_for_function(f"{ANSWER_LINES} > {answers}", timeout=WAIT_MS)
        except Exception as exc:
            events = await page.locator("#events").inner_text()
            raise AssertionError(
                f"{exc!r}: status {await status.inner_text()!r}, error "
                f"{await page.locator('#error').inner_text()!r}, problems {problems}\n"
                f"events:\n{events}\nserver output:\n{''.join(server.output)}"
            ) from None
        after = await info.inner_text()
        assert before.split(" · ")[1] == after.split(" · ")[1]  # the same session
        assert before.split(" · ")[0] != after.split(" · ")[0]  # on a new call
        # a secret lasts 10 minutes: the re-attach does not count on the first one
        assert len(offered_with) == 2 and offered_with[0] != offered_with[1], offered_with
        assert await sessions(base) == 1
        await page.click("#hangup")
        deadline = time.monotonic() + 10
        while await sessions(base) != 0:
            assert time.monotonic() < deadline, "the hang-up did not end the session"
            await page.wait_for_timeout(100)
    assert not problems, problems


@pytest.mark.timeout(240)
@pytest.mark.slow
async def test_a_backchannel_over_the_answer_is_kept_and_the_log_says_so(
    echo_server: tuple[Server, str], backchannel_wav: Path, tmp_path: Path
) -> None:
    """The page asks for adaptive interruption: "Yeah." over the answer (the echo hears no
    words in it: a noise) holds it a moment, and it plays on; the event log says so."""
    server, base = echo_server
    problems: list[str] = []
    async with chromium(tmp_path / "profile", backchannel_wav) as context:
        page = await open_page(context, f"{base}/", problems)
        await expect(page.locator("#server")).to_have_attribute("data-state", "ready")
        await page.click("#connect")
        note = page.locator("#events li.note", has_text="kept")
        try:
            await expect(note.first).to_be_attached(timeout=WAIT_MS)  # the log is folded
        except Exception:
            events = await page.locator("#events").text_content()
            raise AssertionError(
                f"problems {problems}\nevents:\n{events}\nserver output:\n{''.join(server.output)}"
            ) from None
        events = await page.locator("#events").text_content() or ""
        assert '"status":"cancelled"' not in events
        await page.click("#hangup")
        await expect(page.locator("#status")).to_have_attribute("data-state", "ended")
    assert not problems, problems


def _keep(path: Path) -> None:
    """Copy a screenshot to test-artifacts/ at the repo root (ignored by git)."""
    ARTIFACTS.mkdir(exist_ok=True)
    shutil.copy(path, ARTIFACTS / path.name)
