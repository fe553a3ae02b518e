"""The code layout holds: the runtime imports no lesson and runs every collective without one, and no
two modules import each other.

Read from the source (every ``import`` statement, including those inside functions), so a
lazy import cannot hide a dependency.
"""
from __future__ import annotations

import ast
import functools
import pathlib

import networkx as nx
import pytest

import course_lib

PKG = pathlib.Path(course_lib.__file__).resolve().parent
# One test process runs this module: the package's source is parsed once (_tree), not once per
# process that xdist would spread these tests over.
pytestmark = pytest.mark.xdist_group("layout")


@functools.lru_cache(maxsize=None)
def _tree(path: pathlib.Path) -> ast.Module:
    """The parsed source of one module (read-only: callers walk it, never change it)."""
    return ast.parse(path.read_text(), str(path))


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
    for node in ast.walk(_tree(path)):
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
    """The graph of course_lib's imports (a fresh copy: callers may edit it; parsed once)."""
    return _parsed_import_graph().copy()


@functools.lru_cache(maxsize=1)
def _parsed_import_graph() -> nx.DiGraph:
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
        names = _changed_module_names(_tree(path))
        if names:
            found[_module_name(path).removeprefix("course_lib.")] = names
    unexpected = {m: sorted(extra) for m, n in found.items() if (extra := n - ALLOWED_STATE.get(m, set()))}
    assert not unexpected, f"module-level state changed at run time (pass it explicitly instead): {unexpected}"
    stale = {m: sorted(gone) for m, n in ALLOWED_STATE.items() if (gone := n - found.get(m, set()))}
    assert not stale, f"allowed but no longer there, remove from ALLOWED_STATE: {stale}"


# -- the runtime's collectives need no lesson ----------------------------------------------------
def _lesson_packages() -> set[str]:
    from course_lib.lessons import LESSONS

    return {f"course_lib.{lesson.package}" for lesson in LESSONS if lesson.package != "runtime"}


def test_course_lib_init_imports_no_lesson():
    """``import course_lib`` (which ``import course_lib.runtime`` runs first) loads no lesson package."""
    g = import_graph()
    lessons = _lesson_packages()
    assert "course_lib.collectives" in lessons and len(lessons) >= 8, sorted(lessons)
    named = {d for d in g.successors("course_lib") if any(d == p or d.startswith(p + ".") for p in lessons)}
    assert not named, f"course_lib/__init__.py imports lesson code: {sorted(named)}"


# Run in a fresh interpreter: imports the runtime only, checks that no lesson came with it, then runs
# every collective of the communicator with its default algorithm on real processes (fork, p = 1, 2,
# 3, 5) against numpy in this one process. Prints the lesson modules it found loaded, as JSON.
_RUNTIME_ONLY = r'''
import json, sys
import numpy as np
import course_lib.runtime as rt

loaded = sorted(m for m in sys.modules if m.startswith("course_lib."))
FIRST = rt.Op(lambda a, b: a, commute=False, name="first")   # associative, not commutative

def every_collective(comm, n_small, n_large):
    r, p = comm.rank, comm.size
    x = np.arange(n_small, dtype=np.float64) + 10 * r
    big = np.arange(n_large, dtype=np.float64) * (r + 1)
    comm.barrier_with()
    out = {"bcast": comm.bcast(x if r == p - 1 else None, root=p - 1),
           "scatter": comm.scatter(np.stack([x + j for j in range(p)]) if r == 0 else None, root=0),
           "gather": comm.gather(x, root=p // 2), "allgather": comm.allgather({"rank": r}),
           "alltoall": comm.alltoall([x + 100 * j for j in range(p)]), "reduce": comm.reduce(x, root=0),
           "allreduce_small": comm.allreduce(x), "allreduce_ring": comm.allreduce(big),
           "allreduce_rabenseifner": comm.allreduce(big, op=FIRST), "allreduce_obj": comm.allreduce([r]),
           "reduce_scatter": comm.reduce_scatter(big), "scan": comm.scan(x), "exscan": comm.exscan(x)}
    comm.check_collectives = True            # every call first allgathers its signature (Bruck)
    out["checked_allreduce"] = comm.allreduce(x, op=rt.MAX)
    return out

def expected(p, r, n_small, n_large):
    xs = [np.arange(n_small, dtype=np.float64) + 10 * k for k in range(p)]
    bigs = [np.arange(n_large, dtype=np.float64) * (k + 1) for k in range(p)]
    return {"bcast": xs[p - 1], "scatter": xs[0] + r, "gather": xs if r == p // 2 else None,
            "allgather": [{"rank": k} for k in range(p)], "alltoall": [xs[k] + 100 * r for k in range(p)],
            "reduce": np.sum(xs, axis=0) if r == 0 else None, "allreduce_small": np.sum(xs, axis=0),
            "allreduce_ring": np.sum(bigs, axis=0), "allreduce_rabenseifner": bigs[0],
            "allreduce_obj": list(range(p)), "reduce_scatter": np.array_split(np.sum(bigs, axis=0), p)[r],
            "scan": np.sum(xs[:r + 1], axis=0), "exscan": np.sum(xs[:r], axis=0) if r else None,
            "checked_allreduce": np.max(xs, axis=0)}

def same(a, b):
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(same(u, v) for u, v in zip(a, b))
    if a is None or b is None or isinstance(a, dict):
        return a == b
    return np.shape(a) == np.shape(b) and np.array_equal(a, b)

N_SMALL, N_LARGE = 5, 10_001                    # 80 kB: allreduce takes its large-message algorithms
wrong = []
for p in (1, 2, 3, 5):
    with rt.Cluster(p, start_method="fork", timeout=60) as cluster:
        res = cluster.run(every_collective, N_SMALL, N_LARGE)
    for r in range(p):
        want = expected(p, r, N_SMALL, N_LARGE)
        wrong += [f"p={p} rank {r} {name}" for name in want if not same(res[r][name], want[name])]
print(json.dumps({"loaded": loaded, "wrong": wrong}))
'''


def test_the_runtime_runs_every_collective_with_no_lesson_imported():
    """``import course_lib.runtime`` alone: no lesson loaded, and every collective right on real processes."""
    import json
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", _RUNTIME_ONLY], capture_output=True, text=True, timeout=300,
                          cwd=PKG.parent)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    lessons = _lesson_packages() | {"course_lib.costs"}
    loaded = [m for m in report["loaded"] if any(m == p or m.startswith(p + ".") for p in lessons)]
    assert not loaded, f"importing course_lib.runtime loaded lesson code: {loaded}"
    assert "course_lib.runtime.base_collectives" in report["loaded"]
    assert not report["wrong"], f"collectives that disagree with numpy: {report['wrong']}"


def test_one_home_per_algorithm():
    """Lesson 02 registers only its variants; what it teaches of the runtime's is the runtime's own code."""
    from course_lib import collectives
    from course_lib.collectives import allgather, allreduce, alltoall, barrier, broadcast, reduction
    from course_lib.runtime import base_collectives as base

    runtime_rows = {(row.collective, row.name) for row in base.ROWS}
    lesson_rows = {(row.collective, row.name) for row in collectives.ROWS}
    assert not runtime_rows & lesson_rows, sorted(runtime_rows & lesson_rows)
    defaults = {*base.DEFAULTS.items(), ("allgather", "bruck")}
    defaults |= {("allreduce", a) for a in ("recursive_doubling", "ring", "rabenseifner")}
    assert defaults <= runtime_rows, sorted(defaults - runtime_rows)
    for row in base.ROWS:
        assert row.run.__module__ == base.__name__
        assert collectives.ALGORITHMS[row.collective][row.name] is row.run
    assert barrier.dissemination is base.barrier_dissemination and allgather.ring is base.allgather_ring
    assert alltoall.pairwise is base.alltoall_pairwise and reduction.rs_ring is base.reduce_scatter_ring
    assert broadcast.bcast_binomial is base.bcast_binomial and allreduce.allreduce_ring is base.allreduce_ring
