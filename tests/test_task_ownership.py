"""Every task has an owner: no bare `create_task` in Parley's code.

A task nobody holds is cancelled by nobody and awaited by nobody: it outlives its session,
and its error is logged (if at all) long after the fact. So the rule, which an AST walk can
check without running anything:

1. Only `pipeline/tasks.py`, the owner module, calls `asyncio.create_task` or
   `asyncio.ensure_future` (or a loop's `create_task`, or either name imported bare).
2. Everywhere else a task starts as `<owner>.create_task(...)`, where the owner is an
   `asyncio.TaskGroup` or a `pipeline.tasks.TaskSet`. The walk knows a name or attribute is
   one from the module's own code: `async with TaskGroup() as tg` / `TaskSet(...) as ts`,
   `x = TaskSet(...)`, an annotation naming TaskGroup or TaskSet (`self._tg: TaskGroup`, a
   parameter `tasks: TaskSet`), or `self.x = <one of those>`. Local names count in the
   function (or its enclosing functions) that binds them; attributes in the whole module.
3. `background(...)` (a watch) returns its task: a call whose result is thrown away has no
   owner to stop it.
4. `asyncio.shield(<a call>)` starts a task of its own that nobody holds once the waiter is
   cancelled: shield a task an owner holds instead.

The allow-list below is short and says why for each entry; it should only ever shrink.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("realtime", "sessions", "pipeline", "web", "loadtest")
OWNER_MODULE = "pipeline/tasks.py"
OWNER_TYPES = ("TaskGroup", "TaskSet")
STARTERS = ("create_task", "ensure_future")
WORDS = (*STARTERS, "background", "shield")
"""A module whose text has none of these has nothing to check (most have none)."""

ALLOWED: set[str] = set()
"""Modules exempt from the walk, each with a comment saying why: none today."""


def _names_owner_type(node: ast.expr | None) -> bool:
    """Whether an annotation or a constructor call names TaskGroup or TaskSet."""
    if node is None:
        return False
    return any(
        isinstance(sub, ast.Name | ast.Attribute)
        and (sub.id if isinstance(sub, ast.Name) else sub.attr) in OWNER_TYPES
        for sub in ast.walk(node)
    )


def _constructs_owner(node: ast.expr | None) -> bool:
    return isinstance(node, ast.Call) and _names_owner_type(node.func)


Function = ast.FunctionDef | ast.AsyncFunctionDef


class _Walk(ast.NodeVisitor):
    """Collects the rule's violations in one module as (line, what)."""

    def __init__(self, tree: ast.Module, is_owner_module: bool) -> None:
        self.is_owner_module = is_owner_module
        self.found: list[tuple[int, str]] = []
        self.attributes = _owner_attributes(tree)
        self.scopes: list[set[str]] = [_owner_locals(tree.body)]

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self._function(node)

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> None:
        self._function(node)

    def _function(self, node: Function) -> None:
        owners = _owner_locals(node.body)
        args = node.args
        for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs]:
            if _names_owner_type(arg.annotation):
                owners.add(arg.arg)
        self.scopes.append(owners)
        self.generic_visit(node)
        self.scopes.pop()

    def visit_Expr(self, node: ast.Expr) -> None:
        call = node.value
        if isinstance(call, ast.Call) and _called_name(call.func) == "background":
            self.found.append((node.lineno, "background(...) with its task thrown away"))
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        name = _called_name(func)
        if name == "shield" and node.args and isinstance(node.args[0], ast.Call):
            self.found.append((node.lineno, "asyncio.shield(<a call>): an unheld task"))
        elif name in STARTERS and not self._owned(func):
            self.found.append((node.lineno, ast.unparse(func)))
        self.generic_visit(node)

    def _owned(self, func: ast.expr) -> bool:
        if isinstance(func, ast.Name):  # `from asyncio import create_task`
            return self.is_owner_module
        assert isinstance(func, ast.Attribute)
        receiver = ast.unparse(func.value)
        if receiver == "asyncio" or func.attr == "ensure_future":
            return self.is_owner_module
        return receiver in self.attributes or any(receiver in scope for scope in self.scopes)


def _called_name(func: ast.expr) -> str | None:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


def _statements(body: list[ast.stmt]) -> Iterator[ast.AST]:
    """The nodes of `body`, not descending into nested functions or classes."""
    stack: list[ast.AST] = list(body)
    while stack:
        node = stack.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if not isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                stack.append(child)


def _owner_locals(body: list[ast.stmt]) -> set[str]:
    """Plain names bound to a TaskGroup or TaskSet in this scope."""
    owners: set[str] = set()
    for node in _statements(body):
        for target in _owner_targets(node):
            if isinstance(target, ast.Name):
                owners.add(target.id)
    return owners


def _owner_attributes(tree: ast.Module) -> set[str]:
    """Attributes (`self._tasks`) bound to a TaskGroup or TaskSet anywhere in the module,
    directly or from a name that is one."""
    names = {
        t.id for node in ast.walk(tree) for t in _owner_targets(node) if isinstance(t, ast.Name)
    }
    owners = {
        ast.unparse(t)
        for node in ast.walk(tree)
        for t in _owner_targets(node)
        if isinstance(t, ast.Attribute)
    }
    for node in ast.walk(tree):
        value = node.value if isinstance(node, ast.Assign) else None
        if isinstance(value, ast.Name) and value.id in names:
            assert isinstance(node, ast.Assign)
            owners |= {ast.unparse(t) for t in node.targets if isinstance(t, ast.Attribute)}
    return owners


def _owner_targets(node: ast.AST) -> Iterator[ast.expr]:
    """The targets that `node` binds to a TaskGroup or TaskSet."""
    if isinstance(node, ast.AsyncWith | ast.With):
        for item in node.items:
            if item.optional_vars is not None and _constructs_owner(item.context_expr):
                yield item.optional_vars
    elif isinstance(node, ast.Assign) and _constructs_owner(node.value):
        yield from node.targets
    elif isinstance(node, ast.AnnAssign) and (
        _names_owner_type(node.annotation) or _constructs_owner(node.value)
    ):
        yield node.target


def _violations() -> Iterator[str]:
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            relative = path.relative_to(ROOT).as_posix()
            text = path.read_text()
            if relative in ALLOWED or not any(word in text for word in WORDS):
                continue  # a module that names none of them starts no task: not parsed
            tree = ast.parse(text, filename=relative)
            walk = _Walk(tree, is_owner_module=relative == OWNER_MODULE)
            walk.visit(tree)
            for line, what in walk.found:
                yield f"{relative}:{line}: {what}"


def test_every_task_has_an_owner() -> None:
    bare = list(_violations())
    assert not bare, "tasks without an owner (see this test's docstring):\n" + "\n".join(bare)


def test_the_walk_finds_bare_tasks() -> None:
    """The check itself: each bare form is found, each owned one is not."""
    source = """
import asyncio
from pipeline.tasks import TaskSet, background

class Holder:
    def __init__(self) -> None:
        self._tasks = TaskSet("holder")
        self._tg: asyncio.TaskGroup | None = None

    async def run(self, tasks: TaskSet) -> None:
        self._tasks.create_task(work())
        tasks.create_task(work())
        async with asyncio.TaskGroup() as tg:
            tg.create_task(work())
        self._tg.create_task(work())
        self.watch = background(work(), "watch")

async def bare(loop: asyncio.AbstractEventLoop) -> None:
    asyncio.create_task(work())
    asyncio.ensure_future(work())
    loop.create_task(work())
    asyncio.get_running_loop().create_task(work())
    tg.create_task(work())
    background(work(), "lost")
    await asyncio.shield(work())
"""
    tree = ast.parse(source)
    walk = _Walk(tree, is_owner_module=False)
    walk.visit(tree)
    assert [line for line, _ in walk.found] == [19, 20, 21, 22, 23, 24, 25]
