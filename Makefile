# Two commands for a fresh machine: `make lab` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# matplotlib's font cache lives with the environment: one cache in ~/.cache shared by several
# environments keeps the font paths of whichever built it, and once that one is deleted every
# mathtext label warns "findfont: Font family ['STIXGeneral'] not found" in the notebooks.
export MPLCONFIGDIR := $(abspath $(VENV))/matplotlib
# Bytecode is cached even where the shell sets PYTHONDONTWRITEBYTECODE (an empty value turns it off):
# every test process, kernel and worker imports the library and the test modules again, and pytest
# caches the assertion-rewritten test modules only this way (about 3 s less per test process).
export PYTHONDONTWRITEBYTECODE :=

.PHONY: lab test test-fast test-all bench exercises grade clean-shm setup

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[test]"
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 >/dev/null
	touch $(STAMP)

setup: $(STAMP)

# The optional MPI backend (mpi4py + MPICH from the package index) for the MPI tests;
# if it cannot be installed, those tests skip with a message.
MPI_STAMP := $(VENV)/.installed-mpi
# The stamp is written only when the install worked, so the next `make lab` or `make test` tries again.
$(MPI_STAMP): $(STAMP)
	@if $(BIN)/python -m pip install --quiet -e ".[mpi]"; then touch $(MPI_STAMP); else \
		echo "warning: the mpi extra (mpi4py, mpich) could not be installed: lesson 07's MPI cells" \
		     "and the MPI tests will skip, saying why; make lab or make test tries again"; fi

# JupyterLab at the course's root (notebooks/ and exercises/ both reachable), opening on START_HERE.ipynb;
# with the MPI extra, so that lesson 07's MPI cells run (they skip, saying why, where it cannot install).
lab: $(STAMP) $(MPI_STAMP)
	$(BIN)/python -m course_lib.lab

# Tests run in TEST_JOBS processes (pytest-xdist); the tests of one notebook, of the grader's batch
# and of the browser each stay in one process (xdist_group), so each heavy run happens once.
TEST_JOBS ?= 3
XDIST := -n $(TEST_JOBS) --dist loadgroup

# What CI runs: lint, every test in parallel (the notebooks among them: what they say about their
# own timings is a verdict read from the run, course_lib/claims.py), then alone the tests that
# compare measured time with a model. On 2 cores more than 3 test processes made the parallel phase
# no shorter (649 s with 5 against 670 s with 3): the CPU is the limit (both cores 91 % busy on
# average through the parallel phase, 693 s from a fresh clone).
# `make test LESSON=04`: one lesson's library, notebook, exercise and grading fixtures (tests/conftest.py,
# --lesson); a phase with no test of that lesson (pytest's exit status 5) is not a failure.
LESSON_ARGS = $(if $(LESSON),--lesson $(LESSON))
NO_TESTS_IS_FINE = $(if $(LESSON),|| [ $$? -eq 5 ])
test: $(STAMP) $(MPI_STAMP)
	$(BIN)/ruff check .
	COURSE_TEST_LESSONS=$(LESSON) $(BIN)/python -m pytest tests $(XDIST) -m "not sweep and not timing" \
		$(LESSON_ARGS) $(PYTEST_ARGS) $(NO_TESTS_IS_FINE)
	COURSE_TEST_LESSONS=$(LESSON) $(BIN)/python -m pytest tests -p no:xdist -m "timing and not sweep" \
		$(LESSON_ARGS) $(PYTEST_ARGS) $(NO_TESTS_IS_FINE)

# About a minute (56 s on 2 cores): lint and the unit tests under the fork start method, without notebooks, the
# grader's sandbox, mpiexec jobs, 64-worker runs or a browser.
test-fast: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest tests $(XDIST) -m "not slow and not browser and not sweep and not timing" \
		-k "not spawn and not forkserver" $(PYTEST_ARGS)

# The long sweep (about 25 minutes): every lesson notebook under every start method and in
# JupyterLab, every answer fixture through the grader's sandbox, 64 workers failing under spawn
# and forkserver, every library function of the release tried as every answer.
test-all: $(STAMP) $(MPI_STAMP)
	$(BIN)/ruff check .
	COURSE_NOTEBOOK_METHODS=default,spawn,forkserver COURSE_ALL_FIXTURES=1 COURSE_FAULT_WORKERS=64 \
		$(BIN)/python -m pytest tests $(XDIST) -m "not timing" $(PYTEST_ARGS)
	COURSE_NOTEBOOK_METHODS=default,spawn,forkserver $(BIN)/python -m pytest tests -p no:xdist -m timing $(PYTEST_ARGS)

bench: $(STAMP) $(MPI_STAMP)
	$(BIN)/python -m benchmarks

exercises: $(STAMP)
	$(BIN)/python -m course_lib.grading.make_exercises

# make grade NB=exercises/00_cluster_in_your_laptop.ipynb  (or a folder)
NB ?= exercises
OUT ?= grades
grade: $(STAMP)
	$(BIN)/python -m course_lib.grade $(NB) --out $(OUT)

# The Gradescope autograder (README, "Gradescope"): build/gradescope/autograder.zip, with setup.sh
# and run_autograder at its top level. make gradescope LESSON=04 ships lesson 04's hidden checks only;
# GRADESCOPE_ARGS=--no-sandbox lets it grade where bubblewrap cannot run (it refuses otherwise).
LESSON ?=
GRADESCOPE_ZIP ?= build/gradescope/autograder.zip
.PHONY: gradescope
gradescope: $(STAMP)
	$(BIN)/python -m course_lib.grading.gradescope build --out $(GRADESCOPE_ZIP) \
		$(if $(LESSON),--lesson $(LESSON)) $(GRADESCOPE_ARGS)

clean-shm: $(STAMP)
	$(BIN)/python -m course_lib.runtime.shm --sweep

# The student release: notebooks, exercises and a course_lib without the reference answers, in
# $(RELEASE)/ and $(RELEASE).tar.gz (python -m course_lib.release --out DIR).
RELEASE ?= release
.PHONY: release
release: $(STAMP)
	$(BIN)/python -m course_lib.release --out $(RELEASE)
