"""Lesson 01's MapReduce gradient descent on any backend (rank 0 = server).

    mpiexec -n 4 python -m course_lib.run examples/mapreduce_gd.py
    python -m course_lib.run --local 4 examples/mapreduce_gd.py

Every rank builds the same seeded data set: on a real cluster each node would read its
own part from storage; here the data are small enough to make on the spot.
"""
from course_lib.mapreduce import MapReduceSettings, make_least_squares
from course_lib.mapreduce.gd import mapreduce_program

SETTINGS = MapReduceSettings(iters=30, reduce="sum")   # step size: 1/L on the data


def main(comm):
    X, y = make_least_squares(n=1001, d=8, seed=0)[:2]
    out = mapreduce_program(comm, "least_squares", X, y, SETTINGS)
    if comm.rank == 0:
        return {"w": out["w"], "losses": out["losses"]}
    return {"maps": out["maps"]}
