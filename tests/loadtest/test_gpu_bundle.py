"""What `parley serve` imports at start must be on an offline GPU host: carried in the bundle
(`loadtest.gpu_bundle.WHEELS`) or already in its image (`IMAGE_HAS`). A GPU run once found
the server unable to start because a session feature imported its package at the top of a
module (`webrtc_noise_gain`): features a GPU host does not serve import theirs when used."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib.metadata import packages_distributions

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from loadtest.gpu_bundle import IMAGE_HAS, WHEELS

_LOADED = """
import builtins, json, sys
OURS = {"realtime", "sessions", "pipeline", "web", "loadtest"}
wanted = set()
plain_import = builtins.__import__
def noting(name, globals=None, locals=None, fromlist=(), level=0):
    importer = (globals or {}).get("__name__", "").split(".")[0]
    if level == 0 and importer in OURS:
        wanted.add(name.split(".")[0])
    return plain_import(name, globals, locals, fromlist, level)
builtins.__import__ = noting
import web.cli, web.app
import pipeline.engines.qwen3_omni.stage, pipeline.engines.moshi
print(json.dumps(sorted(wanted - OURS - set(sys.stdlib_module_names))))
"""


def test_the_server_starts_on_what_the_bundle_and_the_image_carry() -> None:
    out = subprocess.run(
        [sys.executable, "-c", _LOADED], capture_output=True, text=True, check=True, timeout=120
    )
    loaded = json.loads(out.stdout.splitlines()[-1])  # what Parley's own modules import
    carried = {canonicalize_name(Requirement(w).name) for w in WHEELS} | set(IMAGE_HAS)
    by_module = packages_distributions()
    missing = {
        module: by_module[module]
        for module in loaded
        if module in by_module and not {canonicalize_name(d) for d in by_module[module]} & carried
    }
    assert not missing, f"imported at start but not on a GPU host: {missing}"
