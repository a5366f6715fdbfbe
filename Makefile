# oxygen_ros: `make demo` runs the main job on real images, `make test` runs every test.
# Both set up .venv first (Python 3.11+, pinned ROS 2 Jazzy wheels, torch 2.13.0 CPU, the
# package itself, the PaliGemma tokenizer); set-up is idempotent and skipped when up to date.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.oxygen-setup
TOKENIZER_STAMP := $(VENV)/.oxygen-tokenizer
PYTEST_ARGS ?=

# The ROS wheels install an ament prefix into the venv (ros2-from-pypi.md).
export AMENT_PREFIX_PATH := $(abspath $(VENV))
export ROS_AUTOMATIC_DISCOVERY_RANGE ?= LOCALHOST
export PYTHONUNBUFFERED := 1

.PHONY: setup test demo bench lint clean gpu-check

setup: $(STAMP) $(TOKENIZER_STAMP)

$(STAMP): requirements/ros.txt requirements/runtime.txt requirements/test.txt \
          requirements/constraints.txt setup.py setup.cfg package.xml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check \
	    -r requirements/test.txt -c requirements/constraints.txt
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	@touch $@

$(TOKENIZER_STAMP): $(STAMP)
	$(VENV)/bin/oxygen-fetch-tokenizer
	@touch $@

test: setup
	$(PY) -m pytest $(PYTEST_ARGS)

demo: setup
	$(PY) -m oxygen_ros.tools.demo

bench: setup
	$(VENV)/bin/oxygen-bench --preset small --cameras 1 --decode-budget 100 --tokens-per-cycle 5 \
	    --text-every 1 --frames 20 --json out/bench.json --plot out/bench.png

lint: setup
	$(PY) -m pytest -m linter

clean:
	rm -rf build install log .pytest_cache out

# On a CUDA machine (issue 10): GPU tests, then the full-size figures into docs/gpu/<date>-<gpu>.json.
# Each line fits a 10-minute command; GPU_PYTHON is a Python with a CUDA build of torch.
GPU_PYTHON ?= python3
GPU_OUT ?= docs/gpu
gpu-check:
	$(GPU_PYTHON) -m pytest -m gpu test/gpu -x -q -p no:cacheprovider
	$(GPU_PYTHON) -m oxygen_ros.tools.gpu_check --phases components --backends compiled --out-dir $(GPU_OUT)
	$(GPU_PYTHON) -m oxygen_ros.tools.gpu_check --phases components --backends eager --out-dir $(GPU_OUT)
	$(GPU_PYTHON) -m oxygen_ros.tools.gpu_check --phases bench --out-dir $(GPU_OUT)
	$(GPU_PYTHON) -m oxygen_ros.tools.gpu_check --phases start --out-dir $(GPU_OUT)
