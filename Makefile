# gnnaas: `make test` sets everything up from a fresh clone and runs the test suite.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DATASET ?= synth-small
DATA_ROOT ?= $(if $(GNNAAS_DATA),$(GNNAAS_DATA),../shared/data)
HOST ?= 127.0.0.1
PORT ?= 8000

.PHONY: install test lint serve stop readme-check bench bench-full gpu-check clean

install: $(STAMP)

# torch first: the CPU wheel (a bare `torch` requirement would pull a multi-GB CUDA build).
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e '.[test,dev,ray]'
	touch $(STAMP)

test: $(STAMP)
	GNNAAS_DATA=$(DATA_ROOT) $(BIN)/python -m pytest -n 2 --dist loadscope

lint: $(STAMP)
	$(BIN)/ruff check gnnaas tests benchmarks scripts
	$(BIN)/ruff format --check gnnaas tests benchmarks scripts

# Runs every command block of README.md top to bottom and checks what it prints (see the README).
readme-check: $(STAMP)
	GNNAAS_DATA=$(DATA_ROOT) $(BIN)/python scripts/readme_check.py

# Generates and profiles default variants when none exist, then serves them.
serve: $(STAMP)
	@$(BIN)/gnnaas serve --check-port --host $(HOST) --port $(PORT)
	@$(BIN)/gnnaas --threads 1 prepare --dataset $(DATASET) --data-root $(DATA_ROOT)
	@echo "When the log says 'serve: listening on http://$(HOST):$(PORT)', try:"
	@echo "  curl -s -X POST http://$(HOST):$(PORT)/v1/datasets/$(DATASET)/predict -H 'Content-Type: application/json' -H 'X-Accuracy-Tolerance: 2' -d '{\"nodes\": [0, 1, 2]}' -D -"
	@echo "and stop it with: make stop$(if $(filter-out 8000,$(PORT)), PORT=$(PORT),)"
	GNNAAS_TORCH_THREADS=$${GNNAAS_TORCH_THREADS:-1} $(BIN)/gnnaas serve --dataset $(DATASET) --data-root $(DATA_ROOT) --host $(HOST) --port $(PORT)

# Stops the server on PORT however it was started (make serve in the background, gnnaas serve in
# another shell): the pid file `gnnaas serve` keeps for its port names it; returns once it exited.
stop:
	@$(BIN)/gnnaas stop --host $(HOST) --port $(PORT)

# Each script writes <name>.json and the pages rendered from it (quick runs: .cache/bench/results or
# the work folder; full runs: benchmarks/results); `python benchmarks/<script>.py --render JSON`
# rewrites a page from its JSON without running anything.
bench: $(STAMP)
	$(BIN)/python benchmarks/bench_sampler.py --quick
	$(BIN)/python benchmarks/bench_datasets.py --quick
	$(BIN)/python benchmarks/bench_calibration.py --quick
	$(BIN)/python benchmarks/bench_variants.py --quick --data-root $(DATA_ROOT)
	GNNAAS_DATA=$(DATA_ROOT) $(BIN)/python benchmarks/bench_drift.py --quick
	$(BIN)/python benchmarks/bench_policy.py --quick --check

bench-full: $(STAMP)
	$(BIN)/python benchmarks/bench_sampler.py
	$(BIN)/python benchmarks/bench_datasets.py
	$(BIN)/python benchmarks/bench_calibration.py
	$(BIN)/python benchmarks/bench_variants.py --data-root $(DATA_ROOT)
	GNNAAS_DATA=$(DATA_ROOT) $(BIN)/python benchmarks/bench_drift.py
	$(BIN)/python benchmarks/bench_policy.py --check
	$(BIN)/python benchmarks/bench_router.py

# The CUDA tests and the CUDA latency grid in at most 5 minutes on one GPU, written to
# benchmarks/results/gpu.md; on a machine without CUDA it says so, writes nothing (the committed
# page keeps the last GPU run) and exits 0. `make install`
# puts the CPU build of torch in .venv: on a GPU machine point GPU_PYTHON at a Python whose torch
# has CUDA and gnnaas installed (`$(GPU_PYTHON) -m pip install -e .` keeps a CUDA torch 2.4-2.14),
# e.g. `make gpu-check GPU_PYTHON=~/cuda-env/bin/python`.
GPU_PYTHON ?=
gpu-check: $(if $(GPU_PYTHON),,$(STAMP))
	GNNAAS_DATA=$(DATA_ROOT) $(or $(GPU_PYTHON),$(BIN)/python) benchmarks/gpu_check.py

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
