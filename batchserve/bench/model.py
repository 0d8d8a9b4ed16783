"""``batchserve bench --scenario model``: the real model's serving speed, engines side by side.

One run, one workload: chat prompts of 34-504 tokens, each asking for ``max_tokens`` new tokens
(end of sequence ignored, greedy), every prompt fresh (a nonce at its start, so no engine can
reuse a cached prefix of an earlier run beyond the chat template). Measured, in this order:

- ``static``: the static batch loop the transformers backend ran before (batches of 8, as the
  registry shipped it), in float32 as it shipped and in the engine's dtype: "today's";
- ``transformers-cb``: transformers' own continuous batching (``generate_batch``), the
  alternative the engine was measured against;
- ``engine``: the transformers engine alone, in this process;
- ``vllm-direct``: vLLM's own ``LLM.generate`` on the same token ids (its environment);
- ``service-transformers`` and ``service-vllm``: batchserve end to end, a deployment of every
  role, the prompts sent at once over HTTP and every result long-polled back;
- ``mixed``: on the transformers service, 80 % of requests asking for 16 tokens and 20 % for
  256 at about 60 % of its capacity: the short ones' p90 against their p90 alone.

Tokens/s is generated tokens over the wall time from the first prompt sent to the last answer
back. Every part runs with the same CPU threads.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from batchserve.models.registry import ModelSpec
from batchserve.testing.deployment import ROOT

VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
_TEXT = (
    "the quick brown fox jumps over a lazy dog while rivers carry stories of ancient cities "
    "and quiet mountains under a pale winter sky"
)
WORDS = _TEXT.split()


@dataclass(frozen=True, slots=True)
class Figure:
    """One way of serving the workload: how many tokens it made in how long."""

    name: str
    requests: int
    tokens: int
    seconds: float
    notes: str = ""

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else math.nan


@dataclass
class ModelBench:
    model: str
    dtype: str
    threads: int
    prompts: int
    max_tokens: int
    prompt_tokens: list[int]
    figures: list[Figure] = field(default_factory=list)
    mixed: dict[str, Any] | None = None

    def figure(self, name: str) -> Figure | None:
        return next((f for f in self.figures if f.name == name), None)

    def ratio(self, name: str, baseline: str) -> float | None:
        a, b = self.figure(name), self.figure(baseline)
        if a is None or b is None:
            return None
        return round(a.tokens_per_s / b.tokens_per_s, 3)

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["figures"] = [
            {**asdict(f), "tokens_per_s": round(f.tokens_per_s, 2)} for f in self.figures
        ]
        data["ratios"] = {
            "engine_vs_static_fp32": self.ratio("engine", "static-float32"),
            "service_transformers_vs_static_fp32": self.ratio(
                "service-transformers", "static-float32"
            ),
            "service_transformers_vs_static_same_dtype": self.ratio(
                "service-transformers", f"static-{self.dtype}"
            ),
            "service_vllm_vs_vllm_direct": self.ratio("service-vllm", "vllm-direct"),
            "service_transformers_vs_vllm_direct": self.ratio(
                "service-transformers", "vllm-direct"
            ),
            # What the best engine on this machine makes of the same work: where vLLM itself is
            # short of 3x the static loop (float32 CPUs), the transformers engine cannot be.
            "vllm_direct_vs_static_fp32": self.ratio("vllm-direct", "static-float32"),
        }
        return data


def chat_workload(tokenizer: Any, count: int, nonce: str) -> list[list[dict[str, str]]]:
    """``count`` chat prompts whose templated lengths run evenly from 34 to 504 tokens, each
    starting with ``nonce`` and its number, in a shuffled order."""
    rng = random.Random(5)
    prompts = []
    for n in range(count):
        target = 34 + (504 - 34) * n // max(1, count - 1)
        words = [rng.choice(WORDS) for _ in range(600)]
        low, high = 1, len(words)
        while low < high:  # the fewest words that reach the target length
            middle = (low + high) // 2
            if _length(tokenizer, _message(nonce, n, words[:middle])) >= target:
                high = middle
            else:
                low = middle + 1
        prompts.append(_message(nonce, n, words[:low]))
    rng.shuffle(prompts)
    return prompts


def _message(nonce: str, n: int, words: list[str]) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"[{nonce}-{n}] Summarise this text: {' '.join(words)}"}]


def _length(tokenizer: Any, messages: list[dict[str, str]]) -> int:
    ids = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    return len(ids)


def nonce() -> str:
    return f"{time.time_ns() % 10**12:x}"


# -- in this process ---------------------------------------------------------------------------


def run_static(
    spec: ModelSpec, dtype: str, prompts: list[list[dict[str, str]]], max_tokens: int
) -> Figure:
    """Today's loop: static batches of the registry's old size (8), left-padded."""
    import torch
    from transformers import AutoModelForCausalLM

    from batchserve.bench.static import RowRequest, generate
    from batchserve.models.hf import encode_prompt, ensure_converted, load_tokenizer

    tokenizer = load_tokenizer(spec)
    model = AutoModelForCausalLM.from_pretrained(
        ensure_converted(spec), dtype=getattr(torch, dtype), local_files_only=True
    ).eval()
    rows = [
        RowRequest(f"s{n}", encode_prompt(tokenizer, None, m), max_tokens)
        for n, m in enumerate(prompts)
    ]
    pad = int(tokenizer.pad_token_id)
    tokens = 0
    with torch.inference_mode():
        generate(model, rows[:2], pad_id=pad, eos_ids=frozenset(), decode=lambda _ids: "")
        started = time.perf_counter()
        for at in range(0, len(rows), 8):
            out = generate(
                model, rows[at : at + 8], pad_id=pad, eos_ids=frozenset(), decode=lambda _ids: ""
            )
            tokens += sum(len(r.token_ids) for r in out.rows)
        seconds = time.perf_counter() - started
    return Figure(f"static-{dtype}", len(rows), tokens, seconds, "batches of 8, as shipped")


def run_transformers_cb(
    spec: ModelSpec, dtype: str, prompts: list[list[dict[str, str]]], max_tokens: int
) -> Figure:
    """transformers' own continuous batching (``generate_batch``: a paged cache, per-request
    add and cancel), measured as the alternative to batchserve's engine."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    from batchserve.models.hf import encode_prompt, ensure_converted, load_tokenizer

    tokenizer = load_tokenizer(spec)
    model = AutoModelForCausalLM.from_pretrained(
        ensure_converted(spec),
        dtype=getattr(torch, dtype),
        local_files_only=True,
        attn_implementation="sdpa",
    ).eval()
    inputs = [encode_prompt(tokenizer, None, m) for m in prompts]
    config = GenerationConfig(
        max_new_tokens=max_tokens, do_sample=False, eos_token_id=-1, pad_token_id=0
    )
    batching = ContinuousBatchingConfig(max_requests_per_batch=32, num_blocks=512, page_size=64)
    model.generate_batch(inputs[:2], generation_config=config, continuous_batching_config=batching)
    started = time.perf_counter()
    results = model.generate_batch(
        inputs, generation_config=config, continuous_batching_config=batching
    )
    seconds = time.perf_counter() - started
    tokens = sum(len(r.generated_tokens) for r in results.values())
    return Figure("transformers-cb", len(inputs), tokens, seconds, "generate_batch, 32 at once")


def run_engine(spec: ModelSpec, prompts: list[list[dict[str, str]]], max_tokens: int) -> Figure:
    """The transformers engine alone, stepped in this process as its thread would."""
    import torch

    from batchserve.models.engine import SequenceRequest
    from batchserve.models.transformers_engine import TransformersEngine

    engine = TransformersEngine(spec)
    engine.measure()  # warm-up, as a worker does at start
    for n, messages in enumerate(prompts):
        engine.add(SequenceRequest(f"e{n}", None, messages, max_tokens, 0.0, ignore_eos=True))
    tokens = done = 0
    started = time.perf_counter()
    with torch.inference_mode():
        while done < len(prompts):
            for update in engine.step():
                if update.finished:
                    done += 1
                    tokens += update.completion_tokens
    seconds = time.perf_counter() - started
    return Figure("engine", len(prompts), tokens, seconds, f"max_num_seqs {engine.max_num_seqs}")


def run_vllm_direct(
    spec: ModelSpec, prompts: list[list[dict[str, str]]], max_tokens: int
) -> Figure:
    """vLLM's offline ``LLM.generate``, in vLLM's environment, on the same token ids."""
    from batchserve.models.hf import dtype_name, encode_prompt, load_tokenizer

    tokenizer = load_tokenizer(spec)
    warm = chat_workload(tokenizer, 8, nonce())
    job = {
        "spec": {
            "name": spec.name,
            "backend": "vllm",
            "options": spec.options,
            "context_length": spec.context_length,
        },
        "dtype": dtype_name(spec),
        "max_tokens": max_tokens,
        "warmup": [encode_prompt(tokenizer, None, m) for m in warm],
        "prompts": [encode_prompt(tokenizer, None, m) for m in prompts],
    }
    with tempfile.TemporaryDirectory(prefix="bench-vllm-") as scratch:
        job_path, result_path = Path(scratch) / "job.json", Path(scratch) / "result.json"
        job_path.write_text(json.dumps({**job, "result": str(result_path)}))
        done = subprocess.run(
            [str(VLLM_PYTHON), "-m", "batchserve.bench.vllm", str(job_path)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=1800,
        )
        if done.returncode != 0 or not result_path.exists():
            raise RuntimeError(f"vLLM direct failed ({done.returncode}): {done.stderr[-2000:]}")
        result = json.loads(result_path.read_text())
    return Figure("vllm-direct", len(prompts), result["tokens"], result["seconds"], "LLM.generate")


# -- through the service -----------------------------------------------------------------------


async def run_service(
    url: str,
    headers: dict[str, str],
    model: str,
    prompts: list[list[dict[str, str]]],
    max_tokens: int,
    name: str,
) -> Figure:
    """Every prompt sent at once, every answer long-polled back."""
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=600) as client:
        started = time.perf_counter()
        ids = await asyncio.gather(*(_submit(client, model, m, max_tokens) for m in prompts))
        results = await asyncio.gather(*(_result(client, i) for i in ids))
        seconds = time.perf_counter() - started
    bad = [r for r in results if r["status"] != "succeeded"]
    if bad:
        raise RuntimeError(f"{name}: {len(bad)} requests did not succeed: {bad[0]}")
    tokens = sum(r["usage"]["completion_tokens"] for r in results)
    return Figure(name, len(prompts), tokens, seconds, "HTTP in, result out")


_SUBMIT_TRIES = 40


async def _submit(
    client: httpx.AsyncClient,
    model: str,
    messages: list[dict[str, str]],
    max_tokens: int,
    **extra: Any,
) -> str:
    body = {
        "model": model,
        "messages": messages,
        "params": {"max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, **extra},
    }
    for _ in range(_SUBMIT_TRIES - 1):
        response = await client.post("/v1/requests", json=body)
        if response.status_code != 503:
            break
        # Backpressure (the model's backlog bound, a deadline the backlog makes hopeless): a
        # client waits as told and tries again, as the SDKs do.
        await asyncio.sleep(min(float(response.headers.get("Retry-After", 1)), 30.0))
    else:
        response = await client.post("/v1/requests", json=body)
    response.raise_for_status()
    return str(response.json()["id"])


async def _result(client: httpx.AsyncClient, request_id: str) -> dict[str, Any]:
    while True:
        response = await client.get(f"/v1/requests/{request_id}", params={"wait": 30})
        body: dict[str, Any] = response.json()
        if body["status"] in ("succeeded", "failed", "cancelled", "expired"):
            return body


async def run_mixed(
    url: str,
    headers: dict[str, str],
    model: str,
    tokenizer: Any,
    *,
    duration_s: float,
    load: float = 0.6,
    seed: int = 3,
) -> dict[str, Any]:
    """Short (16 tokens) and long (256) requests, 80/20, open-loop at ``load`` of capacity:
    the short ones' p90 latency against their p90 alone (one at a time, nothing else).

    Capacity is measured on the same mix first: 40 such requests sent at once, requests
    finished a second."""
    short, long_ = 16, 256
    prompts = chat_workload(tokenizer, 8, nonce())[:4]  # the shortest prompts
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=900) as client:

        async def one(messages: list[dict[str, str]], tokens: int) -> float:
            started = time.perf_counter()
            await _result(client, await _submit(client, model, messages, tokens))
            return time.perf_counter() - started

        alone = [await one(prompts[n % 4], short) for n in range(12)]
        burst = [short if n % 5 else long_ for n in range(40)]
        started = time.perf_counter()
        await asyncio.gather(*(one(prompts[n % 4], t) for n, t in enumerate(burst)))
        capacity_rps = len(burst) / (time.perf_counter() - started)
        rate = load * capacity_rps
        rng = random.Random(seed)
        kinds: list[tuple[str, asyncio.Task[float]]] = []
        began = time.perf_counter()
        while time.perf_counter() - began < duration_s:
            tokens = short if rng.random() < 0.8 else long_
            task = asyncio.create_task(one(prompts[rng.randrange(4)], tokens))
            kinds.append(("short" if tokens == short else "long", task))
            await asyncio.sleep(rng.expovariate(rate))
        await asyncio.gather(*(t for _, t in kinds))
    short_s = [t.result() for k, t in kinds if k == "short"]
    long_s = [t.result() for k, t in kinds if k == "long"]
    return {
        "capacity_rps": round(capacity_rps, 3),
        "rate_rps": round(rate, 3),
        "load": load,
        "duration_s": duration_s,
        "requests": len(kinds),
        "short_alone_p90_s": round(_p90(alone), 3),
        "short_mixed_p90_s": round(_p90(short_s), 3),
        "long_mixed_p90_s": round(_p90(long_s), 3) if long_s else None,
        "short_p90_vs_alone": round(_p90(short_s) / _p90(alone), 3),
    }


def _p90(values: list[float]) -> float:
    ordered = sorted(values)
    return (
        ordered[min(len(ordered) - 1, math.ceil(0.9 * len(ordered)) - 1)] if ordered else math.nan
    )


# -- the whole scenario ------------------------------------------------------------------------


def _model_toml(name: str, backend: str, spec: ModelSpec) -> str:
    options = {k: v for k, v in spec.options.items() if isinstance(v, str | int | float | bool)}
    lines = [f"[models.{name}]", f'backend = "{backend}"']
    for key, value in options.items():
        lines.append(f"{key} = {json.dumps(value)}")
    lines += [
        f"max_batch_size = {spec.max_batch_size}",
        f"context_length = {spec.context_length}",
        f"max_new_tokens = {spec.max_new_tokens}",
    ]
    return "\n".join(lines) + "\n"


async def model_scenario(
    spec: ModelSpec,
    *,
    prompts: int,
    max_tokens: int,
    mixed_s: float,
    vllm: bool,
    transformers_cb: bool = True,
    say: Any = print,
    log_root: Path | None = None,
) -> ModelBench:
    """Every figure of the module docstring, in one run."""
    import gc

    import torch

    from batchserve.bench.stack import BenchDeployment, bench_log_dir
    from batchserve.core.settings import load_settings
    from batchserve.models.hf import cpu_threads, dtype_name, load_tokenizer
    from batchserve.testing.deployment import settled

    threads = cpu_threads(spec)
    torch.set_num_threads(threads)
    spec = ModelSpec(
        name=spec.name,
        backend=spec.backend,
        max_batch_size=spec.max_batch_size,
        context_length=spec.context_length,
        max_new_tokens=max(spec.max_new_tokens, 256),
        options={**spec.options, "num_threads": threads},
    )
    dtype = dtype_name(spec)
    tokenizer = load_tokenizer(spec)
    workload = chat_workload(tokenizer, prompts, nonce())
    bench = ModelBench(
        model=spec.name,
        dtype=dtype,
        threads=threads,
        prompts=prompts,
        max_tokens=max_tokens,
        prompt_tokens=sorted(_length(tokenizer, m) for m in workload),
    )

    def record(figure: Figure) -> None:
        bench.figures.append(figure)
        say(
            f"{figure.name}: {figure.tokens} tokens in {figure.seconds:.1f} s = "
            f"{figure.tokens_per_s:.1f} tokens/s"
        )
        gc.collect()

    def fresh() -> list[list[dict[str, str]]]:
        return chat_workload(tokenizer, prompts, nonce())

    for static_dtype in dict.fromkeys(["float32", dtype]):
        record(run_static(spec, static_dtype, fresh(), max_tokens))
    if transformers_cb:
        record(run_transformers_cb(spec, dtype, fresh(), max_tokens))
    record(run_engine(spec, fresh(), max_tokens))
    vllm = vllm and VLLM_PYTHON.exists()
    if vllm:
        record(run_vllm_direct(spec, fresh(), max_tokens))
    models = {"bench-transformers": _model_toml("bench-transformers", "transformers", spec)}
    if vllm:
        models["bench-vllm"] = _model_toml("bench-vllm", "vllm", spec)
    deployment = BenchDeployment(
        load_settings(), {}, workers=1, extra_models=models, log_dir=bench_log_dir(log_root)
    )
    async with deployment.running():
        for name in models:
            python = str(VLLM_PYTHON) if name == "bench-vllm" else None
            await settled(deployment.stack, _start_model, deployment, name, python)
            warm = chat_workload(tokenizer, 4, nonce())
            await run_service(deployment.url, deployment.headers, name, warm, 8, "warm-up")
            label = name.replace("bench-", "service-")
            record(
                await run_service(
                    deployment.url,
                    deployment.headers,
                    name,
                    fresh(),
                    max_tokens,
                    label,
                )
            )
            if name == "bench-transformers" and mixed_s > 0:
                bench.mixed = await run_mixed(
                    deployment.url, deployment.headers, name, tokenizer, duration_s=mixed_s
                )
                say(f"mixed: {bench.mixed}")
            await settled(deployment.stack, _stop_model, deployment, name)
    return bench


def _start_model(deployment: Any, name: str, python: str | None) -> None:
    stack = deployment.stack
    stack.start(f"batcher:{name}", "batcher", "--model", name)
    stack.start(f"worker:{name}", "worker", "--model", name, python=python)
    stack.wait_slots(name, 1, timeout_s=600)


def _stop_model(deployment: Any, name: str) -> None:
    for role in (f"worker:{name}", f"batcher:{name}"):
        deployment.stack.stop(role, timeout_s=90)
