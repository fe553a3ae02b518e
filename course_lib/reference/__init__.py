"""Reference answers of the exercise questions: instructor-only, left out of the student release.

One module per graded lesson, ``ex00`` ... ``ex08``, holds the reference implementation of every
function an exercise question asks for, under the name and with the parameters the question
gives it. These modules are the one home of those functions: the library imports them from
here where it needs them (the gossip runtime its mixing matrix and gossip step, the parameter
server its ring lookup, the asynchronous server its apply step, SyncBatchNorm its merge, the
tensor-parallel network its layers, ...) and keeps its older public names as re-exports
(``course_lib.gossip.metropolis_hastings`` is a thin wrapper of :func:`ex04.metropolis_weights`).

They are also the one place an answer is written: ``make exercises``
(:mod:`course_lib.grading.make_exercises`) writes each function into its solution notebook, the
``def`` line and docstring as the exercise shows them (so a docstring states the task, not the
method) and the body as the solution region; tests/test_one_source.py fails when a notebook
differs. So a body reads as a model answer: comments say why, and what the library needs beyond
the question (an ``isend`` above 16 KiB, an array of keys) is said where it is done. Names it
reads come from the notebook's imports or are imported inside the function (where this module
cannot import them at its top: the package that uses the answer imports this module; the
notebook, which imports them already, shows the function without those lines).

``make release`` (:mod:`course_lib.release`) ships a ``course_lib/reference`` whose modules hold
*stand-ins* instead: functions of the same names and parameters that run the student's own
answer, found in the exercise notebook (:mod:`course_lib.standin`). So the library a student
receives contains no answer, and a part of a lesson that needs one runs on the student's code.

:data:`QUESTIONS` is the one table of which function answers which question. Its names are
the ones the question modules declare (``@question("ex04_1", ..., names=("metropolis_weights",))``
in ``course_lib/questions/ex04.py``); ``tests/test_release.py`` checks that both agree.
"""
from __future__ import annotations

from ..lessons import graded as graded_lessons

#: question id -> the function it asks for (its reference lives in ``course_lib.reference.exNN``)
QUESTIONS = {
    "ex00_1": "sum_shard",
    "ex00_2": "fit_latency_bandwidth",
    "ex00_3": "ring_pass",
    "ex01_1": "full_gradient",
    "ex01_2": "map_gradient",
    "ex01_3": "reduce_update",
    "ex01_4": "comm_time",
    "ex01_5": "speedup_table",
    "ex02_1": "ring_allreduce",
    "ex02_2": "rd_allgather",
    "ex02_3": "merge_stats",
    "ex02_4": "ring_allreduce_time",
    "ex02_5": "switch_loop",
    "ex03_1": "apply_update",
    "ex03_2": "staleness_aware_lr",
    "ex03_3": "hogwild_worker",
    "ex03_4": "expected_wait",
    "ex03_5": "fedavg",
    "ex04_1": "metropolis_weights",
    "ex04_2": "mixing_rate",
    "ex04_3": "gossip_step",
    "ex04_4": "iterations_to_reach",
    "ex05_1": "ring_lookup",
    "ex05_2": "may_read",
    "ex05_3": "significantly_modified",
    "ex05_4": "merge_clocks",
    "ex05_5": "crossover_density",
    "ex05_6": "sgd_worker_loop",
    "ex06_1": "column_parallel_forward",
    "ex06_2": "row_parallel_forward",
    "ex06_3": "row_parallel_backward",
    "ex06_4": "predicted_bubble",
    "ex06_5": "measured_bubble",
    "ex06_6": "in_graph_data_parallel",
    "ex07_1": "bus_bandwidth",
    "ex07_2": "place_ranks",
    "ex07_3": "ring_allreduce_seconds",
    "ex07_4": "next_group",
    "ex08_1": "assign_buckets",
    "ex08_2": "update_scale",
    "ex08_3": "shard_range",
    "ex08_4": "zero_bytes_per_param",
    "ex08_5": "reduce_in_buckets",
}

#: question id -> position of the parameter that the library may give as an array, where the
#: question asks for one value: the library looks up many keys at once (``ring_lookup``) and draws
#: curves over many worker counts (``comm_time``). A stand-in (:mod:`course_lib.standin`) then
#: calls the student's answer once per element.
ELEMENTWISE = {
    "ex01_4": 0,   # comm_time(p, ...)
    "ex05_1": 2,   # ring_lookup(points, owners, key)
}

#: lesson -> the exercise notebook (in ``exercises/``) where a student writes that lesson's answers
NOTEBOOKS = {lesson.number: lesson.notebook for lesson in graded_lessons()}


def lesson_of(qid: str) -> str:
    """``"ex04_1" -> "04"``."""
    return qid[2:4]


def questions_of(lesson: str) -> dict:
    """``{function name: question id}`` of one lesson, in question order."""
    return {name: qid for qid, name in QUESTIONS.items() if lesson_of(qid) == lesson}


def module_name(lesson: str) -> str:
    """The module holding a lesson's references (or, in a release, their stand-ins)."""
    return f"{__name__}.ex{lesson}"


__all__ = ["QUESTIONS", "ELEMENTWISE", "NOTEBOOKS", "lesson_of", "questions_of", "module_name"]
