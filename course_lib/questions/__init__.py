"""Visible checks of the exercise questions, one module per lesson: ``exNN.py``.

Each module registers its questions with :func:`course_lib.grading.question`; a check takes
the student's notebook namespace ``ns`` (a dict) and raises ``AssertionError("hint")`` when
the answer is wrong. Students can read these files: hints, not answers.
"""
