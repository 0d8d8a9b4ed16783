"""The streaming section of docs/benchmarks.md (``bench --scenario streaming``'s document):
plain against streamed throughput per model, and the outside client's figures."""

from __future__ import annotations

from typing import Any

from md_table import table

GOAL = 0.95  # streaming may cost at most 5 % of throughput


def verdict_rows(doc: dict[str, Any]) -> list[list[str]]:
    """One row of the Targets table per model compared."""
    return [
        [
            f"streamed throughput against the same workload not streamed, {m['model']}",
            f"≥ {GOAL:.2f}",
            f"{m['rps_ratio']:.3f} in requests/s over all rounds, "
            f"{m['median_pair_rps_ratio']:.3f} the median pair of rounds; "
            f"CPU a request, plain / streamed, {m['cpu_ratio']:.3f}",
            ("met" if min(m["rps_ratio"], m["median_pair_rps_ratio"]) >= GOAL else "**missed**")
            + " (one run on a shared machine: its pairs of rounds spread ±10 % and more)",
        ]
        for m in doc["models"]
    ]


def streaming_md(doc: dict[str, Any]) -> str:
    rows = []
    for m in doc["models"]:
        for variant in ("plain", "stream"):
            v = m[variant]
            rows.append(
                [
                    m["model"],
                    variant,
                    v["rounds"],
                    v["requests"],
                    v["errors"],
                    f"{v['seconds']:.2f}",
                    f"{v['rps']:.1f}",
                    f"{v['tokens_per_s']:.1f}",
                    f"{v['cpu_ms_total']:.2f} ({_roles(v['cpu_ms'])})",
                    f"**{m['rps_ratio']:.3f}** / {m['median_pair_rps_ratio']:.3f} / "
                    f"**{m['cpu_ratio']:.3f}**"
                    if variant == "stream"
                    else "",
                ]
            )
    text = table(
        ["model", "variant", "rounds", "requests", "errors", "seconds", "requests/s", "tokens/s",
         "CPU ms a request (by role)",
         "streamed / plain: requests/s all rounds / median pair; CPU plain / streamed"],
        rows,
    )  # fmt: skip
    for m in doc["models"]:
        per_round = ", ".join(f"{r['variant']} {r['rps']:.1f}/s" for r in m["rounds"])
        pairs = ", ".join(f"{ratio:.3f}" for ratio in m["pair_rps_ratios"])
        ttft = [r["ttft_p50_ms"] for r in m["rounds"] if r["ttft_p50_ms"] is not None]
        text += (
            f"\n\n{m['model']} ({m['kind']} model, {m['workload']['requests']} requests a round, "
            f"max_tokens {m['workload']['max_tokens']}, closed loop of {m['concurrency']}): "
            f"rounds in order {per_round}; streamed / plain by pair {pairs}"
        )
        if ttft:
            text += f"; our client's TTFT p50 when streamed {min(ttft):.0f}-{max(ttft):.0f} ms"
        text += "."
    clients = [m for m in doc["models"] if m.get("client")]
    if clients:
        text += "\n\nThe outside client, streaming, on the same deployment:\n\n"
        text += table(
            ["model", "client", "requests", "errors", "TTFT p50 / p99 ms", "ITL p50 / p99 ms",
             "latency p50 ms", "requests/s", "output tokens/s"],
            [_client_row(m["model"], m["client"]) for m in clients],
        )  # fmt: skip
        for m in clients:
            text += f"\n\n{m['model']}: `{m['client']['command']}`"
    return text


def _roles(cpu_ms: dict[str, float]) -> str:
    return ", ".join(f"{role} {ms:.2f}" for role, ms in cpu_ms.items())


def _client_row(model: str, c: dict[str, Any]) -> list[Any]:
    return [
        model,
        c["client"],
        c["requests"],
        c["errors"],
        f"{c['ttft_p50_ms']:.1f} / {c['ttft_p99_ms']:.1f}",
        f"{c['itl_p50_ms']:.2f} / {c['itl_p99_ms']:.2f}",
        f"{c['latency_p50_ms']:.1f}",
        f"{c['request_throughput']:.1f}",
        f"{c['output_token_throughput']:.1f}",
    ]
