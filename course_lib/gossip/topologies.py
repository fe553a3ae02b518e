"""Network topologies for decentralized learning, built with networkx.

Every function returns an undirected ``networkx.Graph`` on the nodes ``0..n-1``, which is
exactly what ``Cluster(n, graph=G)`` wants: node ``i`` is rank ``i`` and only the edges of
``G`` get a Pipe. Any graph a student builds works too, as long as it passes
:func:`validate_graph`.

=============  ===========================  ==============================================
name           networkx                     spectral gap 1 - r with Metropolis weights
=============  ===========================  ==============================================
ring           ``cycle_graph``              ~ 1 / n^2
path           ``path_graph``               ~ 1 / n^2
torus          ``grid_2d_graph(periodic)``  ~ 1 / n
hypercube      ``hypercube_graph``          ~ 1 / log n
star           ``star_graph``               ~ 1 / n (the hub carries all the traffic)
complete       ``complete_graph``           1 (one step reaches the average)
expander       ``random_regular_graph``     ~ constant (a random d-regular graph)
erdos_renyi    ``erdos_renyi_graph``        depends on p; may be disconnected
=============  ===========================  ==============================================
"""
from __future__ import annotations

import math
import warnings
from types import MappingProxyType

import networkx as nx

__all__ = [
    "TOPOLOGIES", "DisconnectedGraphWarning", "ring", "path", "torus", "hypercube", "star",
    "complete", "expander", "erdos_renyi", "make_topology", "validate_graph", "components",
    "warn_if_disconnected", "torus_shape", "torus_note", "exchange_rounds", "exchange_order",
]


class DisconnectedGraphWarning(UserWarning):
    """The graph has more than one connected component: nodes agree only inside each."""


def _check_n(n, minimum=1, name="n"):
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"{name} must be an int, got {type(n).__name__}")
    if n < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {n}")


def ring(n: int) -> nx.Graph:
    """Cycle 0-1-...-(n-1)-0. Every node has degree 2 (n >= 3)."""
    _check_n(n)
    return nx.cycle_graph(n) if n >= 3 else nx.path_graph(n)


def path(n: int) -> nx.Graph:
    """Line 0-1-...-(n-1): a ring with one edge removed."""
    _check_n(n)
    return nx.path_graph(n)


def torus_shape(n: int) -> tuple[int, int]:
    """The most square factorisation rows x cols = n (rows <= cols)."""
    _check_n(n)
    rows = int(math.isqrt(n))
    while n % rows:
        rows -= 1
    return rows, n // rows


def torus_note(n: int) -> str:
    """What :func:`torus` builds for ``n`` nodes when it is not a 2-D torus ("" when it is).

    A torus of degree 4 needs ``n = rows x cols`` with both sides at least 3. With ``rows = 1``
    (``n`` prime) the grid is one row wrapped around: a ring. With ``rows = 2`` the wrap-around
    edge of a column is the edge it already has, so every node has 3 neighbours (a prism), not 4
    (and 2 x 2 is a ring of 4).
    The note names the shape and the nearest ``n`` that make a true torus."""
    rows, cols = torus_shape(n)
    if rows >= 3:
        return ""
    true_tori = [m for m in range(max(9, n - 9), n + 10) if torus_shape(m)[0] >= 3]
    below = [m for m in true_tori if m < n]
    above = [m for m in true_tori if m > n]
    nearest = " and ".join(str(m) for m in ([below[-1]] if below else []) + ([above[0]] if above else []))
    if rows == 1:
        what = f"n = {n} is prime, so the only grid is 1 x {n}: a ring (degree 2)"
    elif cols == 2:
        what = "the only grid is 2 x 2, whose wrap-around edges are edges it already has: a ring of 4 (degree 2)"
    else:
        what = (f"the most square grid for n = {n} is 2 x {cols}: the wrap-around of a 2-row column is the edge it "
                f"already has, so every node has 3 neighbours, not 4 (a prism)")
    return f"not a 2-D torus: {what}; the nearest n with a true torus (at least 3 x 3): {nearest}"


def torus(n: int, shape: tuple[int, int] | None = None) -> nx.Graph:
    """2-D torus (grid with wrap-around), rows x cols = n; node (r, c) is rank r * cols + c."""
    rows, cols = shape if shape is not None else torus_shape(n)
    if rows * cols != n:
        raise ValueError(f"torus shape {rows}x{cols} does not have {n} nodes")
    G = nx.grid_2d_graph(rows, cols, periodic=True)
    G = nx.relabel_nodes(G, {(r, c): r * cols + c for r, c in G.nodes})
    return _sorted_graph(G)


def hypercube(n: int) -> nx.Graph:
    """Hypercube of dimension log2(n): i and j are linked when they differ in one bit."""
    _check_n(n)
    if n & (n - 1):
        raise ValueError(f"a hypercube needs n to be a power of 2, got {n}")
    k = n.bit_length() - 1
    G = nx.Graph()
    G.add_nodes_from(range(n))
    G.add_edges_from((i, i ^ (1 << b)) for i in range(n) for b in range(k) if i < i ^ (1 << b))
    return G


def star(n: int) -> nx.Graph:
    """Hub 0 linked to every other node: the shape of a parameter server, without a server."""
    _check_n(n)
    return nx.star_graph(n - 1) if n > 1 else _sorted_graph(nx.empty_graph(1))


def complete(n: int) -> nx.Graph:
    """Every pair linked (a full mesh)."""
    _check_n(n)
    return nx.complete_graph(n)


def expander(n: int, degree: int = 4, seed: int = 0) -> nx.Graph:
    """A connected random ``degree``-regular graph: an expander with high probability.

    Tries seeds ``seed, seed+1, ...`` until the graph is connected, so the result is
    deterministic for a given seed.
    """
    _check_n(n, 2)
    degree = min(degree, n - 1)
    if (n * degree) % 2:
        degree -= 1
    for s in range(seed, seed + 100):
        G = nx.random_regular_graph(degree, n, seed=s)
        if nx.is_connected(G):
            return _sorted_graph(G)
    raise RuntimeError(f"no connected {degree}-regular graph on {n} nodes found")


def erdos_renyi(n: int, p: float | None = None, seed: int = 0, connected: bool = True) -> nx.Graph:
    """G(n, p) random graph. ``p`` defaults to 2 ln(n) / n (above the connectivity threshold).

    With ``connected=True`` seeds ``seed, seed+1, ...`` are tried until the graph is
    connected; ``connected=False`` returns the first draw, which may be disconnected.
    """
    _check_n(n)
    if p is None:
        p = min(1.0, 2 * math.log(max(n, 2)) / n)
    if not 0 <= p <= 1:
        raise ValueError(f"p must be in [0, 1], got {p}")
    for s in range(seed, seed + 1000):
        G = _sorted_graph(nx.erdos_renyi_graph(n, p, seed=s))
        if not connected or nx.is_connected(G):
            return G
    raise RuntimeError(f"no connected G({n}, {p}) found; raise p")


# Read-only: a graph of one's own is passed as a networkx Graph, not registered here.
TOPOLOGIES = MappingProxyType({
    "ring": ring, "path": path, "torus": torus, "hypercube": hypercube, "star": star,
    "complete": complete, "expander": expander, "erdos_renyi": erdos_renyi,
})


def make_topology(name: str, n: int, seed: int = 0, **kwargs) -> nx.Graph:
    """Build a topology by name (see :data:`TOPOLOGIES`)."""
    try:
        fn = TOPOLOGIES[name]
    except KeyError:
        raise ValueError(f"unknown topology {name!r}; choose one of {sorted(TOPOLOGIES)}") from None
    if name in ("expander", "erdos_renyi"):
        kwargs.setdefault("seed", seed)
    return fn(n, **kwargs)


def _sorted_graph(G):
    H = nx.Graph()
    H.add_nodes_from(sorted(G.nodes))
    H.add_edges_from(sorted(tuple(sorted(e)) for e in G.edges))
    return H


def validate_graph(G, n: int | None = None) -> int:
    """Check that ``G`` is an undirected graph on nodes 0..n-1 without self-loops; return n."""
    if not isinstance(G, nx.Graph):
        raise TypeError(f"expected a networkx Graph, got {type(G).__name__}")
    if G.is_directed():
        raise ValueError("gossip needs an undirected graph (communication goes both ways); "
                         "use G.to_undirected()")
    if G.is_multigraph():
        raise ValueError("multigraphs are not supported; use nx.Graph(G)")
    m = G.number_of_nodes()
    if n is None:
        n = m
    if set(G.nodes) != set(range(n)):
        raise ValueError(f"graph nodes must be exactly 0..{n - 1} (the ranks); got "
                         f"{sorted(G.nodes, key=repr)[:8]}... Use nx.convert_node_labels_to_integers(G)")
    loops = list(nx.selfloop_edges(G))
    if loops:
        raise ValueError(f"graph has self-loops {loops[:4]}; a node always keeps its own value, "
                         "remove them with G.remove_edges_from(nx.selfloop_edges(G))")
    return n


def components(G) -> list[list[int]]:
    """Connected components, each a sorted list of nodes, ordered by their smallest node."""
    return sorted((sorted(c) for c in nx.connected_components(G)), key=lambda c: c[0])


def _fmt_component(c):
    return "{" + ", ".join(map(str, c)) + "}" if len(c) <= 12 else \
        "{" + ", ".join(map(str, c[:10])) + f", ... ({len(c)} nodes)}}"


def warn_if_disconnected(G, stacklevel: int = 2) -> list[list[int]]:
    """Warn (DisconnectedGraphWarning) naming the components when G is not connected.

    Returns the components. Gossip on such a graph never reaches the global average:
    each component converges to the average of its own nodes.
    """
    comps = components(G)
    if len(comps) > 1:
        warnings.warn(
            f"graph is disconnected: {len(comps)} components "
            + ", ".join(_fmt_component(c) for c in comps)
            + "; nodes will only agree within their own component, never globally",
            DisconnectedGraphWarning, stacklevel=stacklevel + 1)
    return comps


# A schedule for exchanging models without incast.
def exchange_rounds(G) -> list[list[tuple[int, int]]]:
    """G's edges split into rounds, each a matching (no node twice in one round): a proper
    edge colouring, found by taking a maximum matching (``networkx.max_weight_matching``)
    again and again until no edge is left.

    On a d-regular bipartite graph (an even ring, a torus with even sides, a hypercube)
    every maximum matching is perfect and what is left is (d-1)-regular, so there are
    exactly d rounds (Konig 1916) and every node has one edge in each. Other graphs may
    need a few more rounds than their largest degree.
    """
    validate_graph(G)
    rest = nx.Graph(G)
    rounds = []
    while rest.number_of_edges():
        matching = sorted(tuple(sorted(e)) for e in nx.max_weight_matching(rest, maxcardinality=True))
        rounds.append(matching)
        rest.remove_edges_from(matching)
    return rounds


def exchange_order(G) -> dict[int, list[int]]:
    """{node: its neighbours in the order of :func:`exchange_rounds`}.

    A node that sends its model to its neighbours in this order, and receives theirs in the
    same order, hears in round k from the neighbour it talks to in round k, who sent in its
    own round k too: on a network that charges the receiver's link (incast), no node ever
    has two models arriving at the same moment. Sending in rank order instead, both
    neighbours of ring node n-1 send to it last, and the second model waits behind the first.
    """
    order: dict[int, list[int]] = {i: [] for i in G.nodes}
    for matching in exchange_rounds(G):
        for i, j in matching:
            order[i].append(j)
            order[j].append(i)
    return order
