"""The documentation names only what the code has.

README.md and every page under docs/ are read as text: each `parley serve` / `parley stage`
option they name must be one the CLI's parser takes (web/settings.py), each shipped graph
(`pipeline/configs/NAME.yaml`, `--pipeline NAME`) must exist, each HTTP route of Parley's
(`/v1/...`, `/readyz`, ...) must be one the app serves, and each `python -m loadtest.X`
must be a module of the checkout. A renamed flag, route or benchmark fails here instead of
sending a reader to something that is not there. Regexes over the markdown, no server.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from web.settings import parser

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
CONFIGS = ROOT / "pipeline" / "configs"

# Routes the docs name that are other servers' (an OpenAI-compatible model server's), not Parley's.
FOREIGN_ROUTES = {"/v1/chat/completions", "/v1/models", "/v1"}
# Options the docs name for tools other than Parley's own commands (pip, vllm, locust, sipp).
FOREIGN_OPTIONS = {
    "--no-deps",
    "--no-index",
    "--target",
    "--port",
    "--enable-auto-tool-choice",
    "--tool-call-parser",
    "--enable-prompt-tokens-details",
    "--headless",
    "--csv",
    "--processes",
    "--host",
    "--strict",
    "--python-version",
}


def _text(page: Path) -> str:
    return page.read_text(encoding="utf-8")


def _code(text: str) -> list[str]:
    """Every code span and every line of a code block (a continued line joined to the next)."""
    blocks = re.findall(r"^```[^\n]*\n(.*?)^```", text, flags=re.S | re.M)
    lines: list[str] = []
    for block in blocks:
        lines.extend(block.replace("\\\n", " ").splitlines())
    prose = re.sub(r"^```[^\n]*\n.*?^```", "", text, flags=re.S | re.M)
    lines.extend(re.findall(r"`([^`\n]+)`", prose))
    return lines


def _options(command: str) -> set[str]:
    sub = parser()._subparsers
    assert sub is not None
    (action,) = sub._group_actions
    assert isinstance(action, argparse._SubParsersAction)
    return set(action.choices[command]._option_string_actions)


def _loadtest_source() -> str:
    return "\n".join(p.read_text(encoding="utf-8") for p in (ROOT / "loadtest").rglob("*.py"))


def _parley_commands(pages: list[Path]) -> list[tuple[Path, str, str]]:
    """(page, subcommand, the rest of the line) for each `parley serve|stage ...` named."""
    found = []
    pattern = re.compile(r"(?:\bparley|\bweb\.cli)\s+(serve|stage)\b([^|;#]*)")
    for page in pages:
        for line in _code(_text(page)):
            for match in pattern.finditer(line):
                found.append((page, match.group(1), match.group(2)))
    return found


def test_every_parley_option_named_exists() -> None:
    serve, stage = _options("serve"), _options("stage")
    commands = _parley_commands(PAGES)
    assert len(commands) > 10, "the docs show how to run Parley"
    wrong = [
        f"{page.relative_to(ROOT)}: parley {cmd} {option}"
        for page, cmd, rest in commands
        for option in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", rest)
        if option not in (serve if cmd == "serve" else stage)
    ]
    assert not wrong, wrong


def test_every_option_in_a_table_or_span_is_parleys_or_a_benchmarks() -> None:
    """An option named on its own (`--sip-port`, a row of the options table) is one of
    `parley serve`'s or `parley stage`'s, or one a loadtest command takes. The history page
    is left out: its commands ran at the commits it names, some with options since moved
    into the graph files."""
    known = _options("serve") | _options("stage") | FOREIGN_OPTIONS
    source = _loadtest_source()
    wrong = []
    for page in PAGES:
        if page.name == "history.md":
            continue
        text = _text(page)
        named = set(re.findall(r"^\| `(--[a-z][a-z0-9-]*)`", text, flags=re.M))
        named |= set(re.findall(r"^\| `--[a-z0-9-]+`, `(--[a-z][a-z0-9-]*)`", text, flags=re.M))
        for span in re.findall(r"`([^`\n]+)`", text):
            named |= set(re.findall(r"^(--[a-z][a-z0-9-]*)", span))
        for option in named:
            if option not in known and f'"{option}"' not in source:
                wrong.append(f"{page.relative_to(ROOT)}: {option}")
    assert not wrong, wrong


def test_every_graph_named_is_shipped() -> None:
    shipped = {p.stem for p in CONFIGS.glob("*.yaml")}
    wrong = []
    for page in PAGES:
        text = _text(page)
        for name in re.findall(r"pipeline/configs/([\w.-]+)\.yaml", text):
            if name not in shipped:
                wrong.append(f"{page.relative_to(ROOT)}: pipeline/configs/{name}.yaml")
        for line in _code(text):
            for name in re.findall(r"--pipeline[ =]([\w./-]+)", line):
                if "/" in name or name.endswith(".yaml") or name.isupper():
                    continue  # a path to a graph file of the reader's own
                if name not in shipped:
                    wrong.append(f"{page.relative_to(ROOT)}: --pipeline {name}")
    assert not wrong, wrong


def _route_patterns() -> list[re.Pattern[str]]:
    """A route Parley declares, or the start of one: `/v1/realtime/calls/{call_id}` (a
    call's `Location`) names the resource whose `/hangup` is served."""
    declared = re.compile(r"""(?:Route|WebSocketRoute|Mount)\(\s*"(/[^"]*)\"""")
    paths = {p for f in (ROOT / "web").rglob("*.py") for p in declared.findall(f.read_text())}
    assert "/v1/realtime" in paths and "/readyz" in paths
    patterns = []
    for path in paths:
        parts = path.split("/")
        for end in range(2, len(parts) + 1):
            prefix = re.escape("/".join(parts[:end]))
            patterns.append(re.compile("^" + re.sub(r"\\\{\w+\\\}", "[^/]+", prefix) + "$"))
    return patterns


ROUTE_NAMED = re.compile(r"(/v1(?:/[\w{}<>.|-]+)*|(?<![\w.])/(?:readyz|healthz|metrics)[\w-]*)")


def _doc_routes(text: str) -> set[str]:
    routes = set()
    for span in _code(text):
        for path in ROUTE_NAMED.findall(span):
            for alternative in _alternatives(path.removesuffix("/...")):
                routes.add(alternative)
    return routes


def _alternatives(path: str) -> list[str]:
    """`/v1/x/{id}/accept|reject` is two routes."""
    head, _, last = path.rpartition("/")
    if "|" in last and head:
        return [f"{head}/{part}" for part in last.split("|")]
    return [path]


def test_every_route_named_is_served() -> None:
    patterns = _route_patterns()
    wrong, seen = [], 0
    for page in PAGES:
        for route in _doc_routes(_text(page)):
            if route in FOREIGN_ROUTES:
                continue
            seen += 1
            concrete = re.sub(r"\{\w+\}|<\w+>", "x", route)
            if not any(p.match(concrete) for p in patterns):
                wrong.append(f"{page.relative_to(ROOT)}: {route}")
    assert seen > 20
    assert not wrong, wrong


def test_every_option_of_a_loadtest_command_is_taken() -> None:
    """`python -m loadtest.X --opt ...`: each option is one the loadtest package declares.
    The history page is left out, as above."""
    source = _loadtest_source()
    wrong = []
    for page in PAGES:
        if page.name == "history.md":
            continue
        for line in _code(_text(page)):
            for command in re.findall(r"-m loadtest[\w.]*((?:\s+[^\s`|;]+)*)", line):
                for option in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", command):
                    if f'"{option}"' not in source and option not in FOREIGN_OPTIONS:
                        wrong.append(f"{page.relative_to(ROOT)}: {option}")
    assert not wrong, sorted(set(wrong))


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_loadtest_module_named_exists(page: Path) -> None:
    wrong = []
    for module in re.findall(r"python -m (loadtest(?:\.\w+)+)", _text(page)):
        path = ROOT.joinpath(*module.split("."))
        if not (path.with_suffix(".py").is_file() or (path / "__main__.py").is_file()):
            wrong.append(module)
    assert not wrong, wrong
