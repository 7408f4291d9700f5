# securevfl: `make demo` and `make test` each set up .venv first when it is
# missing or older than the dependency files.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
PIP    := $(BIN)/python -m pip --disable-pip-version-check -q

.PHONY: demo-quick install demo test test-all test-shipped lint typecheck clean bench gpu-check

install: $(STAMP)

$(STAMP): pyproject.toml requirements.txt requirements-dev.txt Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	# CPU build of torch first: anything that later asks for `torch` is then satisfied.
	$(PIP) install torch==2.13.0
	# CrypTen 0.4.1 without its stale metadata (defunct `sklearn`, CUDA torchvision);
	# its real needs are pinned in requirements.txt, and securevfl/_compat.py shims the
	# one torch-2.x import it lacks.
	$(PIP) install --no-deps crypten==0.4.1
	$(PIP) install -r requirements.txt -r requirements-dev.txt
	$(PIP) install --no-deps -e .
	$(BIN)/python -m securevfl.doctor
	touch $(STAMP)

# The whole story in one comparison (protocols/demo/comparison.yaml). runs/demo is a cache:
# an interrupted demo continues where it stopped, and a finished one re-reports in seconds.
demo: $(STAMP)
	$(BIN)/securevfl compare protocols/demo/comparison.yaml --out runs/demo

demo-quick: $(STAMP)
	$(BIN)/securevfl run protocols/plain.yaml --out runs/demo-quick --overwrite

# the default suite, two test files at a time (WORKERS=0: one process; a file's tests share
# its fixtures in one worker); --durations prints where its time goes (the CI log keeps it)
WORKERS ?= 2
test: $(STAMP)
	$(BIN)/python -m pytest -q -n $(WORKERS) --dist loadfile --durations=25

# the default suite and the tests marked slow (the shipped-protocol tier is `make test-shipped`)
test-all: $(STAMP)
	$(BIN)/python -m pytest -q -n $(WORKERS) --dist loadfile -m "not shipped"

# Every protocol file under protocols/ and protocols/demo/ trained with its own settings to
# the floor protocols/floors.toml gives it (tests/shipped/); CI runs it after `make test`.
test-shipped: $(STAMP)
	$(BIN)/python -m pytest -q -m shipped tests/shipped

# ruff, then mypy on securevfl/ (configuration in pyproject.toml); CI runs both.
lint: $(STAMP)
	$(BIN)/ruff check securevfl tests benchmarks examples
	$(BIN)/mypy

typecheck: $(STAMP)
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/python benchmarks/exchange.py

# On a machine with CUDA: every cuda-marked test and the reference benchmark for plain
# and mpc on the device (batch 256 and 4096), under 8 minutes, into ONE JSON file
# (GPU_CHECK_OUT=path, or the variable SECUREVFL_GPU_CHECK_OUT, else runs/gpu-check.json); without
# CUDA it says so and exits 0. It needs a Python whose torch is a CUDA build with
# securevfl's requirements (.venv holds the CPU build): GPU_PYTHON=/path/to/python.
GPU_PYTHON ?= $(if $(wildcard $(BIN)/python),$(BIN)/python,$(PYTHON))
gpu-check:
	$(GPU_PYTHON) benchmarks/gpu_check.py $(if $(GPU_CHECK_OUT),--out $(GPU_CHECK_OUT))

clean:
	rm -rf $(VENV) runs .pytest_cache
