"""Lesson 06: beyond data parallelism. Model (tensor) and pipeline parallelism.

* :mod:`.mlp`        the single-process two-layer network (and a deeper stack), reference
* :mod:`.exchange`   ring allgather / reduce-scatter / allreduce from send and recv, with byte counts
* :mod:`.tensor`     column-parallel first layer, row-parallel second layer
* :mod:`.block_mf`   a matrix too large for one worker: blocks owned by workers (DSGD)
* :mod:`.pipeline`   GPipe and 1F1B schedules, exact bubble, measured bubble
* :mod:`.strategies` data parallelism on the same network, for the comparison table
* :mod:`.group`      run a p-worker program on the first p workers of a bigger cluster
"""
from .mlp import init_mlp, make_data, forward, backward, loss, init_deep, deep_forward_backward, param_bytes
from .exchange import (ring_allgather, ring_reduce_scatter, ring_allreduce,
                       allgather_bytes, reduce_scatter_bytes, allreduce_bytes)
from .tensor import (split_ranges, shard_mlp, column_parallel_forward, row_parallel_forward,
                     row_parallel_backward, column_parallel_backward, tp_mlp_step, assemble_grads,
                     tp_param_bytes, tp_step_bytes)
from .pipeline import (SCHEDULES, stage_ops, simulate, bubble_formula, measured_bubble,
                       stage_layers, pipeline_step, assemble_pipeline_grads)
from .block_mf import mf_serial, mf_worker, mf_bytes_per_worker, mf_full_bytes
from .strategies import data_parallel_step
from .group import FirstRanks, run_on

__all__ = [
    'FirstRanks', 'SCHEDULES', 'allgather_bytes', 'allreduce_bytes', 'assemble_grads',
    'assemble_pipeline_grads', 'backward', 'bubble_formula', 'column_parallel_backward',
    'column_parallel_forward', 'data_parallel_step', 'deep_forward_backward', 'forward', 'init_deep',
    'init_mlp', 'loss', 'make_data', 'measured_bubble', 'mf_bytes_per_worker', 'mf_full_bytes', 'mf_serial',
    'mf_worker', 'param_bytes', 'pipeline_step', 'reduce_scatter_bytes', 'ring_allgather', 'ring_allreduce',
    'ring_reduce_scatter', 'row_parallel_backward', 'row_parallel_forward', 'run_on', 'shard_mlp', 'simulate',
    'split_ranges', 'stage_layers', 'stage_ops', 'tp_mlp_step', 'tp_param_bytes', 'tp_step_bytes',
]
