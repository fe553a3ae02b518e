"""The code layout holds: the runtime imports no lesson, and no two modules import each other.

Read from the source (every ``import`` statement, including those inside functions), so a
lazy import cannot hide a dependency.
"""
from __future__ import annotations

import ast
import pathlib

import networkx as nx

import course_lib

PKG = pathlib.Path(course_lib.__file__).resolve().parent


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: pathlib.Path) -> set[str]:
    """Modules of course_lib that the file names in an import statement."""
    me = _module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                stem = ".".join(base + ([node.module] if node.module else []))
            else:
                stem = node.module or ""
            out.add(stem)
            out |= {f"{stem}.{a.name}" for a in node.names}
    modules = _all_modules()
    return {m for m in out if m in modules and m != me}


_CACHE: dict = {}


def _all_modules() -> dict[str, pathlib.Path]:
    if not _CACHE:
        _CACHE.update({_module_name(p): p for p in PKG.rglob("*.py")})
    return _CACHE


def import_graph() -> nx.DiGraph:
    g = nx.DiGraph()
    for name, path in _all_modules().items():
        g.add_node(name)
        for dep in _imports(path):
            # importing a package's submodule runs the package's __init__ first, but that is
            # Python's loading order, not a dependency this module chose: leave it out
            g.add_edge(name, dep)
    return g


def test_the_runtime_imports_no_lesson():
    g = import_graph()
    runtime = {m for m in g if m == "course_lib.runtime" or m.startswith("course_lib.runtime.")}
    assert len(runtime) >= 12, sorted(runtime)
    outside = {(m, d) for m in runtime for d in g.successors(m) if d not in runtime}
    assert not outside, f"runtime modules importing course_lib code outside the runtime: {sorted(outside)}"


def test_no_import_cycle():
    g = import_graph()
    # a package's __init__ re-exporting its own submodules is not a cycle of design
    g.remove_edges_from([(m, d) for m, d in list(g.edges) if d.startswith(m + ".")])
    cycles = list(nx.simple_cycles(g))
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c + c[:1]) for c in cycles[:10])


def test_the_graph_sees_lazy_imports():
    """The check above cannot pass by missing imports: a known lazy import is in the graph."""
    g = import_graph()
    assert g.has_edge("course_lib.runtime.worker", "course_lib.runtime.comm")
    assert g.has_edge("course_lib.runtime.mpi_backend", "course_lib.runtime.cluster")  # inside MPIComm()
    assert g.has_edge("course_lib.collectives", "course_lib.runtime.registry")


def test_public_names_keep_working():
    from course_lib import ANY_SOURCE, ANY_TAG, SUM, Cluster, Comm, Network, SharedArray, Status, WorkerError  # noqa: F401
    from course_lib.collectives import ALGORITHMS
    from course_lib.runtime import registry

    for collective, table in ALGORITHMS.items():
        assert set(table) == set(registry.algorithms(collective)), collective


def test_lesson_02_and_the_cost_model_read_the_same_rows():
    from course_lib import costs
    from course_lib.runtime import registry

    checked = 0
    for collective in registry.COLLECTIVES:
        for name, row in registry.algorithms(collective).items():
            if row.formula is None:
                continue
            assert costs.FORMULAS[(collective, name)] is row.formula
            model = costs.CostModel(alpha=1e-5, beta=1e-9, gamma=1e-10)
            assert costs.predict(collective, name, 6, 1e6, model) == row.seconds(6, 1e6, 1e-5, 1e-9, 1e-10)
            checked += 1
    assert checked >= 24


# -- module-level state ------------------------------------------------------------------------
_MUTATORS = {"append", "extend", "insert", "update", "add", "pop", "popitem", "clear", "setdefault", "remove",
             "discard"}
# The only module-level containers the library changes after import, and why each is process-wide.
ALLOWED_STATE = {
    # The shared-memory segments this process created or attached: operating-system resources
    # belong to the process (as in Python's own resource tracker), whatever object opened them.
    # (_for_parent: per thread, set while a worker pickles its result for the parent.)
    # (_fell_back: a small /dev/shm's fallback to files is said once per process.)
    "runtime.shm": {"_owned", "_attached", "_kept_for_views", "_inherited", "_detach_later", "_release_listeners",
                    "_instances", "_for_parent", "_fell_back"},
    # In a worker process: its communicator for MPI.COMM_WORLD, and its COMM_SELF once asked for.
    "runtime.mpi_names": {"_world", "_self"},
    # Registries filled once, at import, by the modules that register into them.
    "runtime.collective_api": {"_EXTENSIONS"},
    "grading.registry": {"_REGISTRY", "_PENDING_HIDDEN", "_LOADED_HIDDEN"},
    "ps.messages": {"_BY_KIND"},
    # A worker's attached shared-memory workspaces, kept across the runs of that worker process:
    # attaching again on every call would cost a system call per segment.
    "collectives.shmem": {"_PLANS"},
    # Unsandboxed grading kernels alive now, so that an interrupted grader can kill them.
    "grading.sandbox": {"_LIVE_KERNELS"},
    # On the student's side: the notebook a stand-in read, and the student functions it found.
    "standin": {"_cache", "_found", "_lock", "_active", "_logged"},
    # In a notebook's kernel: its replay of recorded cells (one per kernel, set by the lesson's
    # status cell); while a release is recorded, this process's descriptor of the calls log.
    "replay": {"_session", "_log"},
}


def _changed_module_names(tree: ast.Module) -> set[str]:
    """Module-level names that the module rebinds with ``global`` or changes in place."""
    top = {t.id for node in tree.body if isinstance(node, (ast.Assign, ast.AnnAssign))
           for t in (node.targets if isinstance(node, ast.Assign) else [node.target]) if isinstance(t, ast.Name)}
    changed = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Global):
            changed |= set(node.names)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _MUTATORS:
            if isinstance(node.func.value, ast.Name):
                changed.add(node.func.value.id)
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.Delete)):
            targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
            changed |= {t.value.id for t in targets
                        if isinstance(t, (ast.Subscript, ast.Attribute)) and isinstance(t.value, ast.Name)}
        if isinstance(node, ast.Attribute) and node.attr == "__dict__" and isinstance(node.value, ast.Name):
            changed.add(node.value.id)  # obj.__dict__.clear() and the like
    return changed & top


def test_module_level_state_is_only_the_named_process_wide_registries():
    found = {}
    for path in PKG.rglob("*.py"):
        names = _changed_module_names(ast.parse(path.read_text(), str(path)))
        if names:
            found[_module_name(path).removeprefix("course_lib.")] = names
    unexpected = {m: sorted(extra) for m, n in found.items() if (extra := n - ALLOWED_STATE.get(m, set()))}
    assert not unexpected, f"module-level state changed at run time (pass it explicitly instead): {unexpected}"
    stale = {m: sorted(gone) for m, n in ALLOWED_STATE.items() if (gone := n - found.get(m, set()))}
    assert not stale, f"allowed but no longer there, remove from ALLOWED_STATE: {stale}"
