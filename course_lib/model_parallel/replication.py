"""In-graph and between-graph replication (TensorFlow 1.x; Abadi et al., *TensorFlow: A System for
Large-Scale Machine Learning*, OSDI 2016), named on this course's runs.

TensorFlow 1.x describes a computation as a dataflow graph whose nodes carry a device
(``/job:worker/task:1``, ``/job:ps/task:0``). Its distributed guide names two ways to replicate:

* **in-graph replication**: *one* client builds *one* graph that holds the parameters and every
  replica, each replica's nodes pinned to its own worker task; the workers only execute what the
  graph places on them. The same one client can just as well place *different parts of one model* on
  different workers: model parallelism is in-graph by nature.
* **between-graph replication**: *each* worker has its own client, which builds its own graph with
  the parameters (on the ps tasks) and *one* replica, on itself. This is how this course's data
  parallel runs work: ``cluster.run(fn)`` runs the same function on every worker, and each builds
  its own replica from its rank (lessons 01-05; the ``data_parallel_step`` of this lesson).

Here a graph is a list of :class:`Node` in a topological order, ``device`` being the rank that runs
the node; :func:`run_graph` executes, on one rank, the nodes placed on it: inputs produced on another
rank arrive by ``recv`` (tag = the producer's index), outputs go by ``send`` to every other rank that
consumes them.

The data-parallel graph, :func:`in_graph_data_parallel`, is exercise ex06_6: its one home is
:mod:`course_lib.reference.ex06`, re-exported here under its name.
"""
from __future__ import annotations

from functools import partial

import numpy as np

from course_lib.reference.ex06 import in_graph_data_parallel  # noqa: F401  (question ex06_6)

from .graph import Node, run_graph  # noqa: F401  (the graph's home; re-exported)
from .tensor import split_ranges


# ------------------------------------------------------------------------------ a model cut by one client
def _constant(value):
    return value


def _add_with_bias(bias, *parts):
    return np.sum(parts, axis=0) + bias


def _column_row_block(W1_cols, b1_cols, W2_rows, X):
    """Hidden units c_r of the network: tanh(X W1[:, c_r] + b1[c_r]) W2[c_r, :], a partial sum of Y."""
    return np.tanh(X @ W1_cols + b1_cols) @ W2_rows


def in_graph_model_parallel(params: dict, X, p: int) -> list[Node]:
    """One client splits one model: worker r gets the hidden units c_r (columns of W1, rows of W2)
    and computes its partial sum of Y; rank 0 adds them and b2 (the forward pass of section 3)."""
    nodes = [Node("X", 0, partial(_constant, np.asarray(X)))]
    for r, (a, b) in enumerate(split_ranges(params["W1"].shape[1], p)):
        nodes.append(Node(f"part{r}/Y", r, partial(_column_row_block, params["W1"][:, a:b], params["b1"][a:b],
                                                   params["W2"][a:b]), ("X",)))
    nodes.append(Node("Y", 0, partial(_add_with_bias, params["b2"]), tuple(f"part{r}/Y" for r in range(p))))
    return nodes


def graph_table(nodes: list[Node]) -> str:
    """The graph as a readable table: node, device, inputs."""
    lines = [f"{'node':<16}{'device':<10}inputs"]
    for n in nodes:
        lines.append(f"{n.name:<16}{'rank ' + str(n.device):<10}{', '.join(n.inputs) or '-'}")
    return "\n".join(lines)
