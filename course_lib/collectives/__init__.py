"""Collective communication (lesson 02). Filled in by the collectives lesson."""


class CollectivesMixin:
    """Methods mixed into every communicator: bcast, scatter, gather, allreduce, ..."""
