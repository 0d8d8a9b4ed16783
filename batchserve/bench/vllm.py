"""vLLM used directly, for ``bench --scenario model``: ``python -m batchserve.bench.vllm job.json``.

Runs in vLLM's environment (``.venv-vllm``): builds the engine with the arguments the vllm
worker uses, warms it up on other prompts, then times ``LLM.generate`` on the job's token ids
and writes generated tokens and seconds to the job's ``result`` file (vLLM prints to stdout).
"""

from __future__ import annotations

import json
import os
import sys
import time


def main() -> None:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from batchserve.models.hf import ensure_converted
    from batchserve.models.registry import ModelSpec
    from batchserve.models.vllm_engine import (
        context_length_of,
        engine_arguments,
        engine_environment,
    )

    with open(sys.argv[1]) as handle:
        job = json.load(handle)
    spec = ModelSpec(**job["spec"])
    path = ensure_converted(spec)
    environment = engine_environment(spec)
    os.environ.update(environment)
    if "OMP_NUM_THREADS" in environment:  # the engine runs in this process, torch imported
        import torch

        torch.set_num_threads(int(environment["OMP_NUM_THREADS"]))
    llm = LLM(**engine_arguments(spec, path, context_length_of(spec, path)))
    params = SamplingParams(max_tokens=job["max_tokens"], temperature=0.0, ignore_eos=True)
    llm.generate([TokensPrompt(prompt_token_ids=ids) for ids in job["warmup"]], params)
    prompts = [TokensPrompt(prompt_token_ids=ids) for ids in job["prompts"]]
    started = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    seconds = time.perf_counter() - started
    tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    with open(job["result"], "w") as handle:
        json.dump({"tokens": tokens, "seconds": seconds}, handle)


if __name__ == "__main__":
    main()
