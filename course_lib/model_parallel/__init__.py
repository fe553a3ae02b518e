"""Lesson 06: beyond data parallelism. Model (tensor) and pipeline parallelism.

* :mod:`.mlp`        the single-process two-layer network (and a deeper stack), reference
* :mod:`.exchange`   ring allgather / reduce-scatter / allreduce from send and recv, with byte counts
* :mod:`.tensor`     column-parallel first layer, row-parallel second layer
* :mod:`.block_mf`   a matrix too large for one worker: blocks owned by workers (DSGD)
* :mod:`.pipeline`   GPipe and 1F1B schedules, exact bubble, measured bubble; interleaved 1F1B
                     (simulated and on real processes) and activation recomputation
* :mod:`.strategies` data parallelism on the same network, for the comparison table
* :mod:`.group`      run a p-worker program on the first p workers of a bigger cluster
* :mod:`.replication` TensorFlow's in-graph and between-graph replication: one client's graph of
                     every replica (or every part of one model), run by placement on the workers
"""
from .block_mf import mf_bytes_per_worker, mf_full_bytes, mf_serial, mf_worker
from .exchange import (
                       allgather_bytes,
                       allreduce_bytes,
                       reduce_scatter_bytes,
                       ring_allgather,
                       ring_allreduce,
                       ring_reduce_scatter,
)
from .group import FirstRanks, run_on
from .mlp import backward, deep_forward_backward, forward, init_deep, init_mlp, loss, make_data, param_bytes
from .pipeline import (
                       SCHEDULES,
                       assemble_pipeline_grads,
                       bubble_formula,
                       interleaved_bubble,
                       interleaved_bytes,
                       interleaved_messages,
                       interleaved_ops,
                       interleaved_pipeline_step,
                       measured_bubble,
                       pipeline_step,
                       simulate,
                       simulate_interleaved,
                       stage_layers,
                       stage_ops,
                       stash_bytes,
)
from .replication import Node, graph_table, in_graph_data_parallel, in_graph_model_parallel, run_graph
from .strategies import data_parallel_step
from .tensor import (
                       assemble_grads,
                       column_parallel_backward,
                       column_parallel_forward,
                       row_parallel_backward,
                       row_parallel_forward,
                       shard_mlp,
                       split_ranges,
                       tp_mlp_step,
                       tp_param_bytes,
                       tp_step_bytes,
)

__all__ = [
    'FirstRanks', 'Node', 'SCHEDULES', 'graph_table', 'in_graph_data_parallel', 'in_graph_model_parallel',
    'run_graph', 'allgather_bytes', 'allreduce_bytes', 'assemble_grads', 'assemble_pipeline_grads', 'backward',
    'bubble_formula', 'column_parallel_backward', 'column_parallel_forward', 'data_parallel_step',
    'deep_forward_backward', 'forward', 'init_deep', 'init_mlp', 'interleaved_bubble', 'interleaved_bytes',
    'interleaved_messages', 'interleaved_ops', 'interleaved_pipeline_step', 'loss',
    'make_data', 'measured_bubble', 'mf_bytes_per_worker', 'mf_full_bytes', 'mf_serial', 'mf_worker', 'param_bytes',
    'pipeline_step', 'reduce_scatter_bytes', 'ring_allgather', 'ring_allreduce', 'ring_reduce_scatter',
    'row_parallel_backward', 'row_parallel_forward', 'run_on', 'shard_mlp', 'simulate', 'simulate_interleaved',
    'split_ranges', 'stage_layers', 'stage_ops', 'stash_bytes', 'tp_mlp_step', 'tp_param_bytes', 'tp_step_bytes',
]
