# syntax=docker/dockerfile:1
# batchserve's control plane: api, batcher, maintenance, webhooks and migrate. No torch, no
# transformers, no weights (the API counts prompt tokens with `tokenizers` alone).
#   docker build -f docker/control-plane.Dockerfile -t batchserve-control-plane .
# Every third-party package comes from requirements/control-plane.lock, each file checked against
# its hash (`make locks` writes the lock); batchserve itself is a wheel built from this checkout.
ARG PYTHON_IMAGE=python:3.11.13-slim-bookworm

FROM ${PYTHON_IMAGE} AS builder
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
# The wheel's build backend, hash-checked, in a venv of this stage only: the wheel is built with
# --no-build-isolation, so pip fetches no unpinned setuptools.
COPY requirements/build.lock requirements/build.lock
RUN python -m venv /opt/build \
    && /opt/build/bin/pip install --no-deps --require-hashes --only-binary :all: \
        -r requirements/build.lock
# Third-party packages before the source: this layer survives edits to batchserve/.
COPY requirements/control-plane.lock requirements/control-plane.lock
RUN python -m venv /opt/venv \
    && /opt/venv/bin/pip install --no-deps --require-hashes --only-binary :all: \
        -r requirements/control-plane.lock
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
WORKDIR /var/lib/batchserve
# 8000: the API; 9100: every role's metrics exporter (the API's dashboard too).
EXPOSE 8000 9100
ENTRYPOINT ["batchserve"]
CMD ["api", "--host", "0.0.0.0", "--port", "8000"]
