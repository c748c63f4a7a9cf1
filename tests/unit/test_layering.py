"""No tfdist module imports upward: the layer order, written once, checked on every module's imports (ast).

A module may import modules of lower layers and of its own unit (a row entry
below: a package or module). Units of the same layer are peers and do not
import each other. A unit is matched by the longest name that prefixes the
module, so a package may place one module lower than the rest (the cluster
resolver below the engines that need it, the pure autoscaling policy below
the config that validates with it). README "Architecture" shows the same order.
"""

from __future__ import annotations

import ast
import pathlib

import tfdist

#: Bottom first. Keep README "Architecture" in step with it.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("foundation", ("tfdist.constants", "tfdist.errors", "tfdist._lazy")),
    ("how a task process ends", ("tfdist.exit_status",)),
    ("running a task's script", ("tfdist.run",)),
    ("TF compatibility and datasets", ("tfdist._tf_compat", "tfdist.datasets")),
    ("encoding", ("tfdist.auth", "tfdist.tls", "tfdist.wire")),
    ("transport", ("tfdist.grpc_service",)),
    ("the data plane's lean transport (maps errors as gRPC does)", ("tfdist.stream_service",)),
    ("pure policies and the slowdown injector", ("tfdist.consistency", "tfdist.straggler", "tfdist.slowdown")),
    ("autoscaling policy", ("tfdist.elastic.policy",)),
    ("config", ("tfdist.config",)),
    ("cluster resolver", ("tfdist.cluster.resolver",)),
    ("engines", ("tfdist.ps", "tfdist.collective", "tfdist.data")),
    ("strategies and task processes", ("tfdist.strategies", "tfdist.cluster", "tfdist.checkpoint")),
    ("layers and elastic engine", ("tfdist.layers", "tfdist.elastic")),
    ("callbacks and tools", ("tfdist.callbacks", "tfdist.testing", "tfdist.federated")),
    ("entry points", ("tfdist.launch", "tfdist")),
]

ROOT = pathlib.Path(tfdist.__file__).parent


def _modules() -> dict[str, pathlib.Path]:
    out = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = ("tfdist",) + path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _unit(module: str) -> tuple[int, str] | None:
    """(layer index, unit) of ``module``: the longest unit name that is the module or a package above it."""
    best = None
    for i, (_, units) in enumerate(LAYERS):
        for unit in units:
            matches = module == unit or (unit != "tfdist" and module.startswith(unit + "."))
            if matches and (best is None or len(unit) > len(best[1])):
                best = (i, unit)
    return best


def _imports(module: str, path: pathlib.Path, tree: ast.AST | None = None) -> list[tuple[str, int]]:
    """The tfdist modules ``module`` imports (anywhere in the file, lazily or not), with line numbers."""
    is_package = path.name == "__init__.py"
    out = []
    for node in ast.walk(tree or ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                package = module.split(".") if is_package else module.split(".")[:-1]
                base = package[:len(package) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            for alias in node.names:  # `from tfdist.x import y` imports module tfdist.x.y when there is one
                sub = f"{name}.{alias.name}"
                out.append((sub if sub in MODULES else name, node.lineno))
    return [(name, line) for name, line in out if name == "tfdist" or name.startswith("tfdist.")]


def test_every_module_has_a_layer():
    missing = sorted(m for m in MODULES if _unit(m) is None)
    assert not missing, f"add these modules (or their package) to LAYERS in {__file__}: {missing}"


def test_no_module_imports_upward():
    wrong = []
    for module, path in MODULES.items():
        here = _unit(module)
        for name, line in _imports(module, path):
            there = _unit(name)
            if here is None or there is None or there[1] == here[1]:
                continue
            if there[0] >= here[0]:
                kind = "a peer" if there[0] == here[0] else "a higher layer"
                wrong.append(f"{path.relative_to(ROOT.parent)}:{line}: {module} ({LAYERS[here[0]][0]}) imports "
                             f"{name}, {kind} ({LAYERS[there[0]][0]})")
    assert not wrong, "upward imports:\n" + "\n".join(dict.fromkeys(wrong))


def test_the_checker_sees_upward_imports(tmp_path):
    """The parser resolves relative and lazy imports (a check that finds nothing must be able to find something)."""
    path = tmp_path / "mod.py"
    path.write_text("def f():\n    from ..strategies import parameter_server\n    import tfdist.launch\n")
    names = [n for n, _ in _imports("tfdist.ps.mod", path)]
    assert names == ["tfdist.strategies.parameter_server", "tfdist.launch"]
    assert _unit("tfdist.cluster.resolver")[0] < _unit("tfdist.ps.client")[0] < _unit("tfdist.cluster.local")[0]
    assert _unit("tfdist")[1] == "tfdist" and _unit("tfdist.slowdown")[1] == "tfdist.slowdown"


def _runtime_imports(module: str, path: pathlib.Path) -> set[str]:
    """The tfdist modules ``module`` imports when it runs (``if TYPE_CHECKING:`` blocks left out)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            node.body = [ast.Pass()]
    return {name for name, _ in _imports(module, path, tree) if name != module}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
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
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


EXCHANGE = ("tfdist.ps", "tfdist.strategies", "tfdist.consistency")


def test_the_exchange_layer_has_no_import_cycle():
    """Issue 21 item 9: no two modules of the exchange (PS, strategies, consistency) import each other."""
    graph = {m: {n for n in _runtime_imports(m, p) if n in MODULES and n.startswith(EXCHANGE)}
             for m, p in MODULES.items() if m.startswith(EXCHANGE) and p.name != "__init__.py"}
    graph = {m: {n for n in deps if n in graph} for m, deps in graph.items()}  # packages' faces left out
    assert not _cycles(graph), f"import cycles: {_cycles(graph)}"
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]  # the check can fail


def test_no_file_of_the_exchange_is_over_600_lines():
    """Issue 21 item 9: a file of tfdist/ps or tfdist/strategies says one thing (split a longer one by what it owns)."""
    long = {str(p.relative_to(ROOT.parent)): n for p in [*ROOT.joinpath("ps").glob("*.py"),
                                                         *ROOT.joinpath("strategies").glob("*.py")]
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > 600}
    assert not long, long
