# The environment lives outside the clone, keyed by a hash of the dependency list,
# so repeated runs on one machine reuse it and a fresh machine builds it from nothing.
# The package itself is not installed into it: targets run from src/ of this clone.
PYTHON ?= python3
VENV_ROOT ?= $(HOME)/.cache/lace/venvs
TORCH_PINS := torch==2.14.1 torchvision==0.29.1
# The key is the dependency list itself, so editing other parts of pyproject.toml reuses the environment.
DEPS_HASH := $(shell ($(PYTHON) scripts/list_deps.py pyproject.toml dev hf towers explore scale; echo $(TORCH_PINS)) | sha256sum | cut -c1-12)
VENV := $(VENV_ROOT)/$(DEPS_HASH)
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
RUN := PYTHONPATH=$(CURDIR)/src $(PY)

.PHONY: env browser demo test test-fast lint clean-env

env: $(STAMP)

$(STAMP):
	@mkdir -p $(VENV_ROOT)
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	@# torch and torchvision pinned to a pair that imports together on CPU-only machines
	$(PY) -m pip install -q $(TORCH_PINS)
	$(PY) -m pip install -q $$($(PY) scripts/list_deps.py pyproject.toml dev hf towers explore scale)
	@touch $(STAMP)
	@echo "environment ready: $(VENV)"

demo: env
	$(RUN) -m lace demo --out runs/demo $(DEMO_ARGS)

browser:
	@scripts/ensure_browser.sh

# Both cores; a file's tests stay on one worker, so its module fixtures are built once, and the files go
# out in the order of tests/conftest.py (longest first), not by their number of tests.
XDIST := -n 2 --dist loadfile --no-loadscope-reorder

test: env browser
	$(RUN) -m pytest $(XDIST) $(PYTEST_ARGS)

# The fast lane for a developer: every test but those marked slow (CI runs all through `make test`).
test-fast: env browser
	$(RUN) -m pytest $(XDIST) -m "not slow" $(PYTEST_ARGS)

lint: env
	$(PY) -m ruff check src tests benchmarks

clean-env:
	rm -rf $(VENV)
