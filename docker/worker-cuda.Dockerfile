# syntax=docker/dockerfile:1
# A batchserve worker on NVIDIA GPUs with the transformers engine: the control plane's packages
# plus torch's CUDA build and transformers (pyproject.toml's transformers extra). No weights: a GPU
# worker serves models from a mounted folder or its Hugging Face cache.
#   docker build -f docker/worker-cuda.Dockerfile -t batchserve-worker-cuda .
# Every third-party package comes from requirements/worker-cuda.lock, each file checked against
# its hash (`make locks` writes the lock); batchserve itself is a wheel built from this
# checkout. The lock's torch is PyPI's Linux build, made for CUDA 13.0, whose libraries come as
# nvidia-* wheels: the host needs an NVIDIA driver for CUDA 13 (580 or newer) and the NVIDIA
# container toolkit.
ARG CUDA_IMAGE=nvidia/cuda:13.0.1-runtime-ubuntu22.04

# Ubuntu 22.04 ships Python 3.10: 3.11 comes from the deadsnakes PPA.
FROM ${CUDA_IMAGE} AS python
ENV DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates gpg-agent software-properties-common \
    && add-apt-repository -y ppa:deadsnakes/ppa \
    && apt-get install -y --no-install-recommends python3.11 python3.11-venv \
    && apt-get purge -y --auto-remove gpg-agent software-properties-common \
    && rm -rf /var/lib/apt/lists/*

FROM python AS builder
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
# The wheel's build backend, hash-checked, in a venv of this stage only: the wheel is built with
# --no-build-isolation, so pip fetches no unpinned setuptools.
COPY requirements/build.lock requirements/build.lock
RUN python3.11 -m venv /opt/build \
    && /opt/build/bin/pip install --no-deps --require-hashes --only-binary :all: \
        -r requirements/build.lock
# Third-party packages before the source: this layer survives edits to batchserve/.
COPY requirements/worker-cuda.lock requirements/worker-cuda.lock
RUN python3.11 -m venv /opt/venv \
    && /opt/venv/bin/pip install --no-deps --require-hashes --only-binary :all: \
        -r requirements/worker-cuda.lock
COPY pyproject.toml README.md ./
COPY batchserve ./batchserve
RUN /opt/build/bin/pip wheel --no-deps --no-build-isolation --wheel-dir /tmp/dist . \
    && /opt/venv/bin/pip install --no-deps /tmp/dist/batchserve-*.whl

FROM python
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PATH=/opt/venv/bin:$PATH \
    BATCHSERVE_HOME=/var/lib/batchserve
RUN groupadd --system --gid 10001 batchserve \
    && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/batchserve --create-home \
        --shell /usr/sbin/nologin batchserve
# The same path as in the builder: the venv's scripts name /opt/venv/bin/python.
COPY --from=builder /opt/venv /opt/venv
USER 10001
# Converted weights and caches live under BATCHSERVE_HOME: mount a volume there to keep them.
WORKDIR /var/lib/batchserve
# 9100: the metrics exporter (a worker serves no other port).
EXPOSE 9100
ENTRYPOINT ["batchserve"]
# A worker serves one model: docker run ... IMAGE worker --model NAME
CMD ["worker", "--help"]
