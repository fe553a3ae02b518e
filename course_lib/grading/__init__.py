"""Exercises, checks and grading.

- :func:`question` / :func:`hidden_check`: register the checks of a question ``exNN_k``
  (visible ones in ``course_lib/questions/exNN.py``, instructor ones in ``tests/hidden/exNN.py``).
- :func:`check`: ``check("ex00_1")`` in a notebook runs the visible checks and prints the verdict.
- ``python -m course_lib.grading.make_exercises``: solutions/ -> exercises/.
- ``python -m course_lib.grade PATH... --out DIR``: sandboxed grading (see :mod:`course_lib.grade`).
"""
from .checking import QuestionResult, check, run_question
from .registry import Question, all_questions, get_question, hidden_check, load_lesson, question

__all__ = ["check", "question", "hidden_check", "run_question", "QuestionResult", "Question",
           "get_question", "load_lesson", "all_questions"]
