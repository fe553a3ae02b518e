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

lab: $(STAMP)
	$(BIN)/jupyter lab notebooks/ $$( [ "$$(id -u)" = 0 ] && echo --allow-root )

test: $(STAMP)
	$(BIN)/python -m pytest tests $(PYTEST_ARGS)

bench: $(STAMP)
	$(BIN)/python -m benchmarks

exercises: $(STAMP)
	$(BIN)/python -m course_lib.grading.make_exercises

# make grade NB=exercises/00_cluster_in_your_laptop.ipynb  (or a folder)
NB ?= exercises
OUT ?= grades
grade: $(STAMP)
	$(BIN)/python -m course_lib.grade $(NB) --out $(OUT)

clean-shm: $(STAMP)
	$(BIN)/python -m course_lib.shm --sweep
