"""Shared pytest hooks.

Exercises: one marker per question id (``pytest -m ex00_1``), and ``--notebooks DIR`` to say
which notebooks the per-question tests grade (default: ``solutions/`` when it exists, else
``exercises/``; students run ``pytest -m ex00_1 --notebooks exercises``).
"""


def pytest_addoption(parser):
    parser.addoption("--notebooks", default=None,
                     help="folder of NN_name.ipynb notebooks graded by the per-question tests "
                          "(default: solutions/, else exercises/)")


def pytest_configure(config):
    try:
        from course_lib.grading import all_questions

        questions = all_questions()
    except Exception:  # noqa: BLE001 - a broken question module must not hide every other test
        questions = []
    for q in questions:
        config.addinivalue_line("markers", f"{q.qid}: exercise question {q.qid}, {q.title}")
