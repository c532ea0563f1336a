"""Parley under the same probe as the peers: `parley serve --pipeline echo` on loopback, with
probe.py loaded first, run by this checkout's python.

    .venv/bin/python -m loadtest.peers.bots.parley_bot
Env: PORT, PROBE_PORT.
"""

from __future__ import annotations

import os
import sys

from loadtest.peers import probe  # loopback ICE and the frame clock
from web.cli import main

if __name__ == "__main__":
    probe.install_from_env()
    port = os.environ["PORT"]
    sys.argv = ["parley", "serve", "--host", "127.0.0.1", "--port", port]
    sys.argv += ["--pipeline", "echo", "--max-sessions", "64", "--log-level", "warning"]
    main()
