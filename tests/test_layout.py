"""The package's layout holds: imports run one way, modules stay small, SQL goes through the gateway.

The import graph counts function-level imports too (a cycle hidden in a function still
ties two modules together) and imports under ``if TYPE_CHECKING:`` (they never run, but
two modules that name each other's types are still one tangle to read and to change).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "runrow"

# Modules allowed past ~400 lines, each with its reason.
LONG_MODULES = {
    "embedded.py": "one launcher: finding, fetching and running a server binary, each platform's quirks in one place",
    "sync.py": "the synchronous mirror of every public async call, one thin wrapper each, kept in the one "
    "module hosts import (tests/test_sync_api.py holds it to the async signatures)",
}


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(name: str, path: Path, modules: dict[str, Path], *, type_only: bool = True) -> set[str]:
    """The runrow modules ``name`` imports: when it runs (at import time or in a
    function) and, unless ``type_only`` is False, for its type annotations."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets: set[str] = set()

    def visit(node: ast.AST) -> None:
        if not type_only and isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            targets.update(a.name for a in node.names if a.name.split(".")[0] == "runrow")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if mod.split(".")[0] == "runrow":
                for alias in node.names:
                    sub = f"{mod}.{alias.name}"
                    targets.add(sub if sub in modules else mod)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(encoding="utf-8")))
    # A module's own packages are initialised before it: importing them is no edge.
    parents = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
    return {t for t in targets if t in modules and t != name and t not in parents}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            strong(v)
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def test_imports_run_one_way() -> None:
    assert _cycles(_graph()) == []


def test_the_cycle_check_finds_a_cycle() -> None:
    graph = _graph()
    graph["runrow._gateway.claims"].add("runrow._engine.claimer")  # as if the gateway imported the engine
    # (The cycle pulls in whatever else lies on a path between the two.)
    assert any({"runrow._engine.claimer", "runrow._gateway.claims"} <= set(c) for c in _cycles(graph))


def test_type_only_imports_count() -> None:
    modules = _modules()
    path = modules["runrow._observe"]
    assert "if TYPE_CHECKING:" in path.read_text(encoding="utf-8")
    assert "runrow._engine.view" in _imports("runrow._observe", path, modules)
    assert "runrow._engine.view" not in _imports("runrow._observe", path, modules, type_only=False)


def test_function_level_imports_count() -> None:
    modules = _modules()
    edges = _imports("runrow.cli", modules["runrow.cli"], modules)
    assert "runrow._engine.dispatcher" in edges  # imported inside a function only


def test_the_gateway_and_the_engine_depend_one_way() -> None:
    graph = _graph()
    for name, targets in graph.items():
        if name.startswith("runrow._gateway"):
            assert not {t for t in targets if t.startswith("runrow._engine")}, name


def _active_run_fields() -> set[str]:
    from runrow._engine.flight import ActiveRun

    return set(ActiveRun.__slots__)


def _writes_to_active_runs(tree: ast.AST, fields: set[str]) -> list[str]:
    """``x.field = ...`` (or ``+=``, or a tuple target) with ``field`` one of ActiveRun's,
    outside a class's own ``self.field`` (another class's attribute of the same name)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        else:
            continue
        for target in targets:
            for t in ast.walk(target):
                if (
                    isinstance(t, ast.Attribute)
                    and t.attr in fields
                    and not (isinstance(t.value, ast.Name) and t.value.id == "self")
                ):
                    found.append(f"line {t.lineno}: {ast.unparse(t)}")
    return found


def test_only_the_roster_writes_a_run_in_flight() -> None:
    """An ActiveRun has one writer, the roster; the others read it (its own constructor
    in flight.py fills it in). Only the engine ever holds one."""
    fields = _active_run_fields()
    for name, path in _modules().items():
        if not name.startswith("runrow._engine.") or name == "runrow._engine.roster":
            continue
        writes = _writes_to_active_runs(ast.parse(path.read_text(encoding="utf-8")), fields)
        assert not writes, f"{name} writes to an ActiveRun: {writes}"


def test_the_write_check_sees_a_write() -> None:
    fields = _active_run_fields()
    tree = ast.parse("def f(active):\n    active.phase = 'released'\n    a.reason, b = None, 1\n")
    assert _writes_to_active_runs(tree, fields) == ["line 2: active.phase", "line 3: a.reason"]
    assert _writes_to_active_runs(ast.parse("self.phase = 1\nx.other = 2\n"), fields) == []


@pytest.mark.parametrize("name", sorted(_modules()))
def test_modules_stay_small(name: str) -> None:
    path = _modules()[name]
    rel = path.relative_to(SRC).as_posix()
    lines = len(path.read_text(encoding="utf-8").splitlines())
    assert lines <= 400 or rel in LONG_MODULES, (
        f"{rel} has {lines} lines: split it, or state why in LONG_MODULES"
    )


# The gateway's one convention (see runrow/_gateway/__init__.py): a function that runs SQL
# is a plan, run by _exec.run or _exec.run_sync; it takes no connection. The exceptions,
# each the hot path's own: the claim's raw positional cursor and the ending's pipeline.
GATEWAY_TAKES_A_CONNECTION = {
    "runrow._gateway.claims": {"claim", "fetch", "rows_cursor", "run"},
    "runrow._gateway.endings": {"finalize", "finalize_then_claim", "unset_session_bound"},
}


def _gateway_functions() -> dict[str, dict[str, object]]:
    import importlib
    import inspect

    found: dict[str, dict[str, object]] = {}
    for name in _modules():
        if not name.startswith("runrow._gateway.") or name.rsplit(".", 1)[1].startswith("_"):
            continue
        module = importlib.import_module(name)
        found[name] = {
            fname: fn
            for fname, fn in inspect.getmembers(module, inspect.isfunction)
            if fn.__module__ == name and not fname.startswith("_")
        }
    return found


def _takes_a_connection(fn: object) -> bool:
    import inspect

    assert callable(fn)
    if inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn):
        return True
    params = inspect.signature(fn).parameters.values()
    return any(
        p.name in {"conn", "connection", "cur", "cursor"} or "Connection" in str(p.annotation) for p in params
    )


def test_the_gateway_has_one_calling_convention() -> None:
    import inspect

    functions = _gateway_functions()
    assert len(functions) > 10
    plans = 0
    for module, named in functions.items():
        allowed = GATEWAY_TAKES_A_CONNECTION.get(module, set())
        assert allowed <= set(named), f"{module}: no such functions {allowed - set(named)}"
        for name, fn in named.items():
            if name in allowed:
                assert _takes_a_connection(fn), f"{module}.{name} is a plan now: drop it from the list"
                continue
            assert not _takes_a_connection(fn), (
                f"{module}.{name} takes a connection: make it a plan (see runrow/_gateway/__init__.py)"
            )
            plans += inspect.isgeneratorfunction(fn)
    assert plans > 40


def test_the_sql_speaks_the_event_vocabulary() -> None:
    """The statements that write or read runrow's own events use the names in
    runrow/_events.py (a rename on one side only fails here)."""
    from runrow import _events

    # (Migrations too: the reaper's uncertain tool calls are read by a function, 0025.)
    text = "\n".join(p.read_text(encoding="utf-8") for p in (SRC.parents[1] / "sql").rglob("*.sql"))
    for name in (
        _events.USER_MESSAGE_CREATED,
        _events.RUN_QUEUED,
        _events.TOOL_CALL_STARTED,
        _events.TOOL_CALL_FINISHED,
        _events.TERMINAL_EVENT,
        _events.INPUT_REQUESTED,
        _events.INPUT_PROVIDED,
        # ("stopped" is the worker's own: its ending writer sets it, not SQL.)
        *(r for r in _events.ENDING_REASONS if r != "stopped"),
    ):
        assert f"'{name}'" in text, f"no SQL statement spells the event name {name!r}"
    assert "runrow/_events.py" in text, "the SQL's event literals should point at runrow/_events.py"


def test_no_module_shares_a_public_name() -> None:
    """``runrow.enqueue`` is the function, and no module hides behind it (``import
    runrow.enqueue`` finds nothing); implementation modules are private."""
    import importlib.util

    import runrow

    for name in runrow.__all__:
        assert importlib.util.find_spec(f"runrow.{name}") is None, f"runrow.{name} is also a module"
    public_modules = {
        "runrow",
        "runrow.cli",
        "runrow.embedded",
        "runrow.http",
        "runrow.admin",
        "runrow.metrics",
        "runrow.protocols",
        "runrow.pytest_plugin",
        "runrow.sync",
        "runrow.testing",
        "runrow.tracing",
    }
    for name in _modules():
        top = name.split(".")[1] if "." in name else ""
        # runrow.contrib.*: optional integrations, public by their framework's conventions
        # (a Django app's models, admin and management commands live at fixed paths);
        # runrow.adapters.*: one public module per model client library. A public
        # package's own modules are private (runrow.http._runs, ...).
        private_part = name in public_modules or name.rsplit(".", 1)[-1].startswith("_")
        in_public_package = ".".join(name.split(".")[:2]) in public_modules and private_part
        assert (
            name in public_modules
            or top.startswith("_")
            or top in {"demo", "contrib", "adapters"}
            or in_public_package
        ), f"{name} should be private"
