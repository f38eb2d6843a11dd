"""No import cycles: the import graph of gpupool's packages, built with ``ast`` from every
``import`` statement (module level and inside functions alike: an import deferred into a
function is still a dependency, usually one hiding a cycle), has no cycle; and the
packages depend on each other one way only (core <- adapters <- inference <- hub), and so do
the folders (and loose modules) of the hub."""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("scheduler", "inference", "hub_ext", "gpupool")


def modules(root: Path, packages) -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` file under the packages."""
    out = {}
    for pkg in packages:
        for path in sorted((root / pkg).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _imported(name: str, path: Path, node: ast.Import | ast.ImportFrom, mods) -> set[str]:
    """The modules of ``mods`` that one import statement in module ``name`` loads by name:
    ``from pkg import sub`` depends on ``pkg.sub`` when that is a module, else on ``pkg``."""
    if isinstance(node, ast.Import):
        wanted = [alias.name for alias in node.names]
    else:
        if node.level:
            base = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
            base = base[: len(base) - node.level + 1]
            prefix = ".".join(base + ([node.module] if node.module else []))
        else:
            prefix = node.module or ""
        wanted = [f"{prefix}.{a.name}" if f"{prefix}.{a.name}" in mods else prefix for a in node.names]
    found = set()
    for target in wanted:
        while target and target not in mods:
            target = target.rpartition(".")[0]
        if target and target != name:
            found.add(target)
    return found


def import_graph(root: Path, packages) -> dict[str, dict[str, int]]:
    """module -> {imported module: line of the first such import}."""
    mods = modules(root, packages)
    graph: dict[str, dict[str, int]] = {m: {} for m in mods}
    for name, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for target in _imported(name, path, node, mods):
                    graph[name].setdefault(target, node.lineno)
    return graph


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components with more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def describe(graph, comp: list[str]) -> str:
    edges = [f"  {a} -> {b} (line {graph[a][b]})" for a in comp for b in sorted(graph[a]) if b in comp]
    return f"cycle of {len(comp)} modules: {', '.join(comp)}\n" + "\n".join(edges)


def package_graph(graph) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for a, targets in graph.items():
        for b, line in targets.items():
            pa, pb = a.split(".")[0], b.split(".")[0]
            out.setdefault(pa, {})
            if pa != pb:
                out[pa].setdefault(pb, line)
    return out


def test_no_import_cycle_between_modules():
    graph = import_graph(ROOT, PACKAGES)
    assert len(graph) > 100  # the packages were found
    found = cycles(graph)
    assert not found, "\n".join(describe(graph, c) for c in found)


def test_packages_import_one_way():
    """scheduler (the core and its adapters) imports nothing of inference or the hub;
    inference (the activator and autoscaler the chart also runs on its own) imports the
    scheduler and nothing of the hub; the hub imports both; gpupool (what workloads import)
    imports none; no package cycle."""
    graph = import_graph(ROOT, PACKAGES)
    pkgs = package_graph(graph)

    def arrows(src, dst):
        return [f"{a} -> {b}" for a, t in graph.items() if a.split(".")[0] == src
                for b in t if b.split(".")[0] == dst]

    assert "hub_ext" not in pkgs["scheduler"], arrows("scheduler", "hub_ext")
    assert "inference" not in pkgs["scheduler"], arrows("scheduler", "inference")
    assert "hub_ext" not in pkgs["inference"], arrows("inference", "hub_ext")
    assert "scheduler" in pkgs["hub_ext"] and "inference" in pkgs["hub_ext"]
    assert not pkgs["gpupool"], pkgs["gpupool"]  # the workload package runs anywhere
    assert not cycles(pkgs), cycles(pkgs)


def hub_part(module: str) -> str:
    """The folder of the hub a module is in (``hub_ext.org.roles`` -> ``org``); a module
    directly in ``hub_ext`` is a part of its own (``hub_ext.runtime`` -> ``runtime``)."""
    return module.split(".")[1]


def part_graph(graph) -> dict[str, dict[str, str]]:
    """hub part -> {hub part it imports: one such import, ``module -> module (line N)``}."""
    out: dict[str, dict[str, str]] = {}
    for a, targets in graph.items():
        if not a.startswith("hub_ext."):
            continue
        out.setdefault(hub_part(a), {})
        for b, line in targets.items():
            if b.startswith("hub_ext.") and hub_part(b) != hub_part(a):
                out[hub_part(a)].setdefault(hub_part(b), f"{a} -> {b} (line {line})")
    return out


def test_hub_folders_import_one_way():
    """No two folders of the hub import each other, not even through others: the parts of
    ``hub_ext`` (its folders, and each module directly in it) form no cycle."""
    parts = part_graph(import_graph(ROOT, PACKAGES))
    assert {"db", "org", "requests", "cluster", "workspaces", "api", "serving"} <= set(parts)
    both = sorted(f"{a} <-> {b}: {parts[a][b]}; {parts[b][a]}"
                  for a in parts for b in parts[a] if a < b and a in parts.get(b, {}))
    assert not both, "\n".join(both)
    found = cycles(parts)
    assert not found, "\n".join(
        f"{c}: " + "; ".join(parts[a][b] for a in c for b in parts[a] if b in c) for c in found)


# scheduler's adapters, each a folder beside the core; the other folders are the core's
SCHEDULER_ADAPTERS = ("scheduler.embedded", "scheduler.kubernetes", "scheduler.metrics", "scheduler.sim")
SCHEDULER_CORE_FOLDERS = ("scheduler.actions", "scheduler.placement")
CORE_THIRD_PARTY = {"numpy", "gpupool"}  # gpupool.errors imports nothing


def _under(name: str, packages) -> bool:
    return any(name == p or name.startswith(p + ".") for p in packages)


def test_scheduler_top_level_is_the_pure_core():
    """scheduler's top-level modules (and actions/, placement/) are the pure core: they import
    no adapter (embedded/, k8s/, sim/, the Prometheus metrics/) and nothing beyond the standard
    library and numpy, so no I/O creeps into the core. Every folder of scheduler/ is either
    the core's or an adapter."""
    graph = import_graph(ROOT, PACKAGES)
    folders = {".".join(p.relative_to(ROOT).parent.parts) for p in (ROOT / "scheduler").glob("*/__init__.py")}
    assert folders == set(SCHEDULER_ADAPTERS) | set(SCHEDULER_CORE_FOLDERS), folders
    core = {m for m in graph if m.startswith("scheduler") and not _under(m, SCHEDULER_ADAPTERS)}
    assert {"scheduler.core", "scheduler.snapshot", "scheduler.actions.allocate"} <= core
    wrong = [f"{m} -> {t} (line {line})" for m in sorted(core) for t, line in graph[m].items()
             if _under(t, SCHEDULER_ADAPTERS)]
    assert not wrong, "\n".join(wrong)
    foreign, mods = [], modules(ROOT, ("scheduler",))
    for name in sorted(core):
        foreign += [f"{name}:{line} imports {t}" for line, t in top_level_imports(mods[name])
                    if t not in sys.stdlib_module_names and t not in CORE_THIRD_PARTY | {"scheduler"}]
    assert not foreign, "\n".join(foreign)


def top_level_imports(path: Path) -> list[tuple[int, str]]:
    """(line, top-level package) of each absolute import in ``path``."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name.split(".")[0]) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            out.append((node.lineno, node.module.split(".")[0]))
    return out


def test_the_charts_activator_composes_inference_with_the_hubs_serving_side():
    """chart/files/activator.py is an entry point, as hubconfig.py is: it runs inference's
    activator with the hub's replica pods, published services and request rules (records
    0027, 0038), so that inference/ itself imports nothing of the hub. Of the hub it takes
    serving/ and requests/ only."""
    path = ROOT / "chart" / "files" / "activator.py"
    hub_parts = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("hub_ext."):
            hub_parts.add(node.module.split(".")[1])
    assert "inference" in {t for _, t in top_level_imports(path)}
    assert hub_parts and hub_parts <= {"serving", "requests"}, hub_parts


def test_every_imported_package_exists():
    """A module moved or removed leaves no import behind, even one inside a function that no
    test calls."""
    workload_own = {"torch"}  # gpupool.checkpoint imports it only for a state that holds it
    missing = []
    for name, path in modules(ROOT, PACKAGES).items():
        missing += [f"{name}:{line} imports {t}" for line, t in top_level_imports(path)
                    if t not in workload_own and importlib.util.find_spec(t) is None]
    assert not missing, "\n".join(missing)


def test_finds_a_cycle_through_a_function_level_import(tmp_path):
    """The check itself: a cycle closed by an import inside a function, through a relative
    ``from . import``, is found and named."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from .sub import b\n")
    (pkg / "sub" / "b.py").write_text("import pkg.c\n")
    (pkg / "c.py").write_text("def f():\n    from . import a\n    return a\n")
    (pkg / "d.py").write_text("from pkg.a import something\n")
    graph = import_graph(tmp_path, ("pkg",))
    assert graph["pkg.d"] == {"pkg.a": 1}
    found = cycles(graph)
    assert found == [["pkg.a", "pkg.c", "pkg.sub.b"]]
    assert "pkg.c -> pkg.a (line 2)" in describe(graph, found[0])
