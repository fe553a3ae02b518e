# Two commands for a fresh machine: `make lab` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: lab test bench exercises grade clean-shm setup

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
$(MPI_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet -e ".[mpi]" || echo "warning: the mpi extra could not be installed; MPI tests will skip"
	touch $(MPI_STAMP)

lab: $(STAMP)
	$(BIN)/jupyter lab notebooks/ $$( [ "$$(id -u)" = 0 ] && echo --allow-root )

test: $(STAMP) $(MPI_STAMP)
	$(BIN)/python -m pytest tests $(PYTEST_ARGS)

bench: $(STAMP) $(MPI_STAMP)
	$(BIN)/python -m benchmarks

exercises: $(STAMP)
	$(BIN)/python -m course_lib.grading.make_exercises

# make grade NB=exercises/00_cluster_in_your_laptop.ipynb  (or a folder)
NB ?= exercises
OUT ?= grades
grade: $(STAMP)
	$(BIN)/python -m course_lib.grade $(NB) --out $(OUT)

clean-shm: $(STAMP)
	$(BIN)/python -m course_lib.runtime.shm --sweep

# The student release: notebooks, exercises and a course_lib without the reference answers, in
# $(RELEASE)/ and $(RELEASE).tar.gz (python -m course_lib.release --out DIR).
RELEASE ?= release
.PHONY: release
release: $(STAMP)
	$(BIN)/python -m course_lib.release --out $(RELEASE)
