"""Lesson 08: data parallelism as it is practised.

Modules, one concept each: :mod:`.model` (the layer stack flattened into one vector, and Adam),
:mod:`.memory` (bytes per parameter and activations), :mod:`.mixed_precision` (fp16 with fp32
master weights and dynamic loss scaling), :mod:`.ddp` (buckets allreduced while backward goes
on), :mod:`.overlap` (that step's alpha-beta model and two-lane timeline), :mod:`.zero` (ZeRO
stages 1-3), :mod:`.compression` (top-k with error feedback).
The network is lesson 06's stack of tanh layers (:func:`course_lib.model_parallel.mlp.init_deep`).
"""
