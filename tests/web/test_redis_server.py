"""EmbeddedRedis against a real redis-server: config, teardown, and dying with its parent."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from web.redis_server import EmbeddedRedis, RedisServerMissing

REPO_ROOT = Path(__file__).resolve().parents[2]
INSTALL_HINT = "install it with: apt-get install redis-server"


def _alive(pid: int) -> bool:
    """Whether pid is a live process; a zombie counts as gone (PID 1 may not reap here)."""
    try:
        stat_line = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat_line.rsplit(")", 1)[1].split()[0] != "Z"


def _wait_gone(pid: int, within: float) -> bool:
    deadline = time.monotonic() + within
    while _alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def _kill_if_alive(pid: int) -> None:
    if _alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture
def private_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Point mkdtemp at an empty dir, so a test can see what EmbeddedRedis left there."""
    root = tmp_path / "tmp"
    root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    yield root
    shutil.rmtree(root, ignore_errors=True)


def test_start_serves_private_durable_socket_and_stop_cleans_up(private_tmp: Path) -> None:
    server = EmbeddedRedis()
    server.start()
    pid = server.pid
    try:
        assert pid is not None
        assert server.running
        runtime_dir = Path(server.socket_path).parent
        assert runtime_dir.parent == private_tmp
        assert runtime_dir.name.startswith("parley-redis-")
        assert server.url == f"unix://{runtime_dir}/redis.sock"
        assert stat.S_IMODE(runtime_dir.stat().st_mode) == 0o700
        sock = Path(server.socket_path).stat()
        assert stat.S_ISSOCK(sock.st_mode)
        assert stat.S_IMODE(sock.st_mode) == 0o700

        client = redis.Redis.from_url(server.url, decode_responses=True)
        try:
            assert client.ping()
            assert client.config_get("appendonly") == {"appendonly": "yes"}
            assert client.config_get("appendfsync") == {"appendfsync": "everysec"}
            assert client.config_get("port") == {"port": "0"}
            assert client.config_get("save") == {"save": ""}
        finally:
            client.close()
    finally:
        server.stop()

    assert not _alive(pid)
    assert not server.running
    assert server.pid is None
    assert not runtime_dir.exists()
    assert list(private_tmp.iterdir()) == []
    server.stop()  # a second stop is a no-op


def test_context_manager_and_given_runtime_dir_is_kept(tmp_path: Path) -> None:
    runtime_dir = tmp_path / "rt"
    with EmbeddedRedis(runtime_dir=str(runtime_dir)) as server:
        pid = server.pid
        assert pid is not None
        client = redis.Redis(unix_socket_path=server.socket_path)
        try:
            assert client.ping()
        finally:
            client.close()
    assert not _alive(pid)
    assert (runtime_dir / "redis.conf").exists()  # the caller's directory, so it stays


def test_server_dies_when_its_parent_is_killed(tmp_path: Path) -> None:
    runtime_dir = tmp_path / "rt"
    script = textwrap.dedent(
        f"""
        import time
        from web.redis_server import EmbeddedRedis
        server = EmbeddedRedis(runtime_dir={str(runtime_dir)!r})
        server.start()
        print(server.pid, flush=True)
        time.sleep(60)
        """
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", script],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    redis_pid: int | None = None
    try:
        assert parent.stdout is not None
        line = parent.stdout.readline()
        if not line:
            _, err = parent.communicate(timeout=10)
            pytest.fail(f"child did not start redis: {err}")
        redis_pid = int(line)
        assert _alive(redis_pid)

        parent.kill()
        parent.wait(timeout=10)

        assert _wait_gone(redis_pid, within=5.0), "redis-server outlived its parent"
    finally:
        if parent.poll() is None:
            parent.kill()
        parent.communicate(timeout=10)
        if redis_pid is not None:
            _kill_if_alive(redis_pid)
        shutil.rmtree(runtime_dir, ignore_errors=True)


def test_missing_executable_path_names_the_install_hint(tmp_path: Path) -> None:
    server = EmbeddedRedis(executable=str(tmp_path / "no-such-redis-server"))
    with pytest.raises(RedisServerMissing, match=INSTALL_HINT) as info:
        server.start()
    assert "\n" not in str(info.value)
    assert not server.running


def test_missing_on_path_names_the_install_hint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    with pytest.raises(RedisServerMissing) as info:
        EmbeddedRedis().start()
    assert str(info.value) == (
        "redis-server not found on PATH; install it with: apt-get install redis-server"
    )


def test_runtime_dir_that_is_a_file_raises(tmp_path: Path) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    server = EmbeddedRedis(runtime_dir=str(not_a_dir))
    with pytest.raises(RuntimeError, match="cannot prepare redis runtime dir"):
        server.start()
    assert server.pid is None
    assert not server.running


def test_server_that_exits_on_start_raises_with_its_log(tmp_path: Path) -> None:
    # A socket path over the 108-byte sun_path limit: redis-server starts, then gives up.
    runtime_dir = tmp_path / ("d" * 120)
    server = EmbeddedRedis(runtime_dir=str(runtime_dir))
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="path too long") as info:
        server.start(timeout=10.0)
    assert time.monotonic() - started < 5.0
    assert "exited with code" in str(info.value)
    assert server.pid is None
    assert not server.running


def test_server_that_never_answers_is_killed_and_its_dir_removed(
    tmp_path: Path, private_tmp: Path
) -> None:
    pid_file = tmp_path / "fake.pid"
    fake = tmp_path / "fake-redis-server"
    fake.write_text(f'#!/bin/sh\necho $$ > "{pid_file}"\nexec sleep 30\n')
    fake.chmod(0o755)
    server = EmbeddedRedis(executable=str(fake))
    fake_pid: int | None = None
    try:
        with pytest.raises(RuntimeError, match="did not answer PING"):
            server.start(timeout=0.5)
        fake_pid = int(pid_file.read_text())
        assert not _alive(fake_pid)
        assert server.pid is None
        assert list(private_tmp.iterdir()) == []
    finally:
        server.stop()
        if fake_pid is None and pid_file.exists():
            fake_pid = int(pid_file.read_text())
        if fake_pid is not None:
            _kill_if_alive(fake_pid)


def test_stop_escalates_to_sigkill_when_sigterm_is_not_enough(private_tmp: Path) -> None:
    server = EmbeddedRedis()
    server.start()
    pid = server.pid
    assert pid is not None
    try:
        os.kill(pid, signal.SIGSTOP)  # a stopped process cannot act on SIGTERM
        started = time.monotonic()
        server.stop(timeout=0.3)
        assert time.monotonic() - started < 3.0
        assert not _alive(pid)
        assert list(private_tmp.iterdir()) == []
    finally:
        server.stop()
        _kill_if_alive(pid)


def test_a_killed_servers_runtime_dir_is_removed_by_the_next_start(private_tmp: Path) -> None:
    """A server killed before its stop (SIGKILL; `os._exit` after a sticky device error)
    leaves its directory; the next embedded Redis removes it, and keeps a live one's."""
    script = textwrap.dedent(
        """
        import time
        from web.redis_server import EmbeddedRedis
        server = EmbeddedRedis()
        server.start()
        print(server.pid, flush=True)
        time.sleep(60)
        """
    )
    env = {**os.environ, "TMPDIR": str(private_tmp)}
    killed = subprocess.Popen(
        [sys.executable, "-c", script], cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True, env=env
    )
    assert killed.stdout is not None
    redis_pid = int(killed.stdout.readline())
    killed.kill()
    killed.communicate(timeout=10)
    assert _wait_gone(redis_pid, within=5.0)
    (left,) = private_tmp.glob("parley-redis-*")
    with EmbeddedRedis() as live:
        live_dir = Path(live.socket_path).parent
        assert not left.exists()
        with EmbeddedRedis() as another:
            assert live_dir.exists() and Path(another.socket_path).parent != live_dir
    assert not list(private_tmp.glob("parley-redis-*"))
