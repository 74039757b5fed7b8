"""The specdec package has no import cycles, and no module grows past MAX_LINES lines.

Every ``import`` / ``from ... import`` in every module counts, at any depth (a function-level
import only postpones a cycle, it does not remove it). ``from .x import y`` is an edge to ``x``,
or to ``x.y`` where ``y`` is a submodule; ``from . import name`` likewise. A package's
``__init__`` (named by the package) importing its own submodules is normal; a submodule that
imports its package back closes a cycle (``import P`` runs ``P/__init__``, which imports ``P.a``,
which asks ``P`` for a name it may not hold yet), and is reported like any other.
"""

from __future__ import annotations

import ast
import pathlib
import pkgutil

SRC = pathlib.Path(__file__).resolve().parent.parent / "src"
PACKAGE = "specdec"
MAX_LINES = 400


def module_files(root: pathlib.Path = SRC, package: str = PACKAGE) -> dict[str, pathlib.Path]:
    """Every module of the package: dotted name → file (a package is named by its ``__init__.py``).

    ``pkgutil.iter_modules`` level by level, as ``walk_packages`` would, but without importing
    anything (a module need not import cleanly to be checked).
    """
    files = {package: root / package / "__init__.py"}
    todo = [(package, root / package)]
    while todo:
        prefix, folder = todo.pop()
        for info in pkgutil.iter_modules([str(folder)], prefix=prefix + "."):
            leaf = folder / info.name.rsplit(".", 1)[-1]
            if info.ispkg:
                files[info.name] = leaf / "__init__.py"
                todo.append((info.name, leaf))
            else:
                files[info.name] = leaf.with_suffix(".py")
    return dict(sorted(files.items()))


def imports_of(name: str, path: pathlib.Path, modules: set[str], package: str = PACKAGE) -> set[str]:
    """The package's modules that ``name`` (at ``path``) imports, anywhere in its source."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()

    def add(target: str, names: list[str]) -> None:
        for alias in names:
            if f"{target}.{alias}" in modules:  # from pkg import submodule
                found.add(f"{target}.{alias}")
            elif target in modules:
                found.add(target)

    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == package or alias.name.startswith(package + "."):
                    found.add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                here = name.split(".") if is_package else name.split(".")[:-1]
                base = here[: len(here) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target == package or target.startswith(package + "."):
                add(target, [alias.name for alias in node.names])
    found.discard(name)
    return found & modules


def import_graph(root: pathlib.Path = SRC, package: str = PACKAGE) -> dict[str, set[str]]:
    files = module_files(root, package)
    return {name: imports_of(name, path, set(files), package) for name, path in files.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), each sorted; sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:  # recursion depth ≤ number of modules (about a hundred)
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
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
    return sorted(out)


def describe(component: list[str], graph: dict[str, set[str]]) -> str:
    members = set(component)
    return "\n".join(f"  {a} -> {', '.join(sorted(graph[a] & members))}" for a in component)


def test_the_cycle_finder_finds_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e", "d"}, "f": {"g"}, "g": {"f"}}
    assert cycles(graph) == [["a", "b", "c"], ["f", "g"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_imports_resolve_relative_and_submodule_forms(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from .a import x\n")
    (pkg / "a.py").write_text("from . import b\nfrom .sub import c\n\ndef f():\n    from pkg.sub.c import y\n")
    (pkg / "b.py").write_text("import pkg.sub\n")
    (pkg / "sub" / "__init__.py").write_text("from .. import a\nfrom ..b import z\n")
    (pkg / "sub" / "c.py").write_text("import os\n")
    graph = import_graph(tmp_path, "pkg")
    assert graph == {
        "pkg": {"pkg.a"},
        "pkg.a": {"pkg.b", "pkg.sub.c"},
        "pkg.b": {"pkg.sub"},
        "pkg.sub": {"pkg.a", "pkg.b"},
        "pkg.sub.c": set(),
    }
    assert cycles(graph) == [["pkg.a", "pkg.b", "pkg.sub"]]


def test_specdec_has_no_import_cycles():
    graph = import_graph()
    assert len(graph) > 30 and "specdec.decode" in graph
    found = cycles(graph)
    assert not found, "import cycles:\n" + "\n\n".join(describe(c, graph) for c in found)


def test_every_module_is_at_most_max_lines():
    lengths = {name: len(path.read_text(encoding="utf-8").splitlines()) for name, path in module_files().items()}
    offenders = {name: n for name, n in lengths.items() if n > MAX_LINES}
    assert not offenders, f"modules over {MAX_LINES} lines: " + ", ".join(
        f"{name} ({n})" for name, n in sorted(offenders.items()))


FLOOR = ("specdec.rule", "specdec.sampling", "specdec.decode", "specdec.stats", "specdec.theory", "specdec.gamma")
ABOVE = ("specdec.loading", "specdec.choices", "specdec.session", "specdec.server", "specdec.cli", "specdec.bench")


def reachable(graph: dict[str, set[str]], start: str) -> dict[str, str]:
    """Every module ``start`` imports, at any depth: module → the module that imports it (for the path)."""
    seen = {start: ""}
    todo = [start]
    while todo:
        v = todo.pop()
        for w in sorted(graph.get(v, ())):
            if w not in seen:
                seen[w] = v
                todo.append(w)
    del seen[start]
    return seen


def chain(parents: dict[str, str], end: str) -> str:
    path = [end]
    while parents.get(path[-1]):
        path.append(parents[path[-1]])
    return " <- ".join(path)


def test_the_reachability_finds_an_indirect_import():
    parents = reachable({"a": {"b"}, "b": {"c"}, "c": set(), "d": {"a"}}, "a")
    assert set(parents) == {"b", "c"} and chain(parents, "c") == "c <- b <- a"


def test_the_algorithm_and_the_drafters_know_nothing_of_files_names_or_front_ends():
    """The rule, sampling, decode, stats, theory, γ policies and every drafter import nothing, at any
    depth, from loading (model files), choices (names), session, server, cli or bench."""
    graph = import_graph()
    drafters = [name for name in graph if name == "specdec.drafters" or name.startswith("specdec.drafters.")]
    assert len(drafters) >= 5 and all(name in graph for name in FLOOR)
    offenders = []
    for start in (*FLOOR, *drafters):
        parents = reachable(graph, start)
        offenders += [chain(parents, m) for m in sorted(parents) if m.startswith(ABOVE)]
    assert not offenders, "the algorithm floor imports from above it:\n" + "\n".join(offenders)


def test_the_kernels_package_knows_nothing_of_models_or_loading():
    """``specdec.native`` (the compiled kernels, the GGUF reader) sits below the models that use it and the loading
    that picks them: none of its modules imports, at any depth, from models, loading or anything above them."""
    graph = import_graph()
    native = [name for name in graph if name == "specdec.native" or name.startswith("specdec.native.")]
    assert len(native) >= 4
    offenders = []
    for start in native:
        parents = reachable(graph, start)
        offenders += [chain(parents, m) for m in sorted(parents) if m.startswith(("specdec.models", *ABOVE))]
    assert not offenders, "the kernels package imports from above it:\n" + "\n".join(offenders)

