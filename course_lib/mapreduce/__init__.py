"""Lesson 01: synchronous MapReduce gradient descent, its cost, stragglers and faults.

    from course_lib.mapreduce import mapreduce_gd, gd_serial, make_least_squares
    X, y, _ = make_least_squares(4000, 20, seed=0)
    with Cluster(3) as cluster:                   # rank 0 = server, ranks 1..2 = workers
        res = mapreduce_gd(cluster, "least_squares", X, y, iters=50)
    w_serial, _ = gd_serial("least_squares", X, y, iters=50)   # equal to 1e-12

The run's settings are one :class:`MapReduceSettings` (``mapreduce_gd(cluster, p, X, y, settings)``),
or its fields as keywords, as above.
"""
from .blas import blas_env, os_threads, pin_blas
from .cost import SpeedupModel, bytes_per_iteration, fit_latency_bandwidth, server_link_time, words_per_iteration
from .gd import GDResult, mapreduce_gd
from .losses import LeastSquares, Logistic, Problem, get_problem, make_least_squares, make_logistic
from .serial import (
    REDUCES,
    default_lr,
    gd_serial,
    gd_update,
    initial_w,
    map_shard,
    minibatch,
    reduce_results,
    sgd_serial,
    shard_ranges,
)
from .settings import MapReduceSettings

__all__ = [
    "blas_env", "os_threads", "pin_blas",
    "SpeedupModel", "bytes_per_iteration", "fit_latency_bandwidth", "server_link_time", "words_per_iteration",
    "GDResult", "MapReduceSettings", "mapreduce_gd",
    "LeastSquares", "Logistic", "Problem", "get_problem", "make_least_squares", "make_logistic",
    "REDUCES", "default_lr", "gd_serial", "gd_update", "initial_w", "map_shard", "minibatch", "reduce_results",
    "sgd_serial", "shard_ranges",
]
