"""Lesson 01's MapReduce gradient descent on any backend (rank 0 = server).

    mpiexec -n 4 python -m course_lib.run examples/mapreduce_gd.py
    python -m course_lib.run --local 4 examples/mapreduce_gd.py

Every rank builds the same seeded data set: on a real cluster each node would read its
own part from storage; here the data are small enough to make on the spot.
"""
import numpy as np

from course_lib.mapreduce.gd import _program
from course_lib.mapreduce.losses import get_problem, make_least_squares
from course_lib.mapreduce.serial import default_lr, initial_w

ITERS = 30


def main(comm):
    X, y = make_least_squares(n=1001, d=8, seed=0)[:2]
    problem = get_problem("least_squares")
    lr, w0 = default_lr(problem, X), initial_w(y, X.shape[1])
    out = _program(comm, problem, X, y, ITERS, lr, w0, "sum", 0, np.empty(0), None, None, {})
    if comm.rank == 0:
        return {"w": out["w"], "losses": out["losses"]}
    return {"maps": out["maps"]}
