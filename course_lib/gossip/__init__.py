"""Lesson 04: decentralized learning. Gossip averaging and D-PSGD on networkx graphs.

* :mod:`.topologies`: ring, path, torus, hypercube, star, complete, expander, Erdos-Renyi;
  graph checks and the disconnected-graph warning; exchange rounds (a proper edge colouring).
* :mod:`.mixing`: Metropolis-Hastings weights, matrix checks, spectrum and rate r.
* :mod:`.consensus`: single-process references (same summation order as the workers).
* :mod:`.dpsgd`: the least-squares problem, D-PSGD and centralised SGD references.
* :mod:`.workers`: the functions each node process runs.
* :mod:`.run`: drivers that start a ``Cluster(n, graph=G)`` and collect trajectories.
* :mod:`.network_time`: time per iteration on an emulated network, the alpha-beta model and
  the measurement; the bytes at the busiest node.
"""
from . import workers  # noqa: F401  (the notebook shows their source)
from .consensus import *  # noqa: F401,F403
from .consensus import __all__ as _c
from .dpsgd import *  # noqa: F401,F403
from .dpsgd import __all__ as _d
from .mixing import *  # noqa: F401,F403
from .mixing import __all__ as _m
from .network_time import *  # noqa: F401,F403
from .network_time import __all__ as _n
from .run import *  # noqa: F401,F403
from .run import __all__ as _r
from .topologies import *  # noqa: F401,F403
from .topologies import __all__ as _t
from .workers import *  # noqa: F401,F403
from .workers import __all__ as _w

__all__ = [*_t, *_m, *_c, *_d, *_w, *_r, *_n]
