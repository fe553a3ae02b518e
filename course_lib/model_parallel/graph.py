"""A dataflow graph placed on ranks, as TensorFlow 1.x describes a computation (lesson 06).

A graph is a list of :class:`Node` in a topological order, ``device`` being the rank that runs
the node; :func:`run_graph` executes, on one rank, the nodes placed on it. Its own module, apart
from :mod:`.replication`, so that the reference answer of ex06_6, which builds such a graph,
imports it without a cycle.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable


@dataclass(frozen=True)
class Node:
    """One operation of the graph: ``op(*values of inputs)``, run on rank ``device``."""

    name: str
    device: int
    op: Callable
    inputs: tuple = field(default=())


def run_graph(comm, nodes: list[Node]) -> dict:
    """Execute the nodes placed on ``comm.rank``, in list order; return {name: value} of those nodes."""
    index = {n.name: k for k, n in enumerate(nodes)}
    consumers = {n.name: {m.device for m in nodes if n.name in m.inputs} for n in nodes}
    values = {}
    for node in nodes:
        if node.device != comm.rank:
            continue
        for name in node.inputs:
            if name not in values:   # made on another rank: it comes through a Pipe
                values[name] = comm.recv(source=nodes[index[name]].device, tag=index[name])
        with comm.compute(node.name):
            values[node.name] = node.op(*(values[name] for name in node.inputs))
        for dest in sorted(consumers[node.name] - {comm.rank}):
            comm.send(values[node.name], dest, tag=index[node.name])
    return {n.name: values[n.name] for n in nodes if n.device == comm.rank}
