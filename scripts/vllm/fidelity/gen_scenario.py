"""Writes a synthetic fidelity scenario, to time the harness or try it by hand.

    python3 gen_scenario.py --requests 2000 --seed 0 --out s.json [--async-scheduling]

Each request's prompt is one of 20 shared prefixes (512, 1,024 or 2,048 tokens) plus
16-799 tokens of its own; 1-299 output tokens; 4 arrivals a step; the connector answers
missing, ready or pending for 1-3 probes (a third each), with a hit of a random
whole-block length below the prompt's. Settings: 4,096 blocks of 16 tokens, 256
sequences, an 8,192-token budget, chunked prefill and prefix caching (the scenario
the folder's README times). Deterministic for a seed.
"""

import argparse
import json
import random


def scenario(n, seed, async_scheduling=False):
    """The scenario dict (see harness.py for the format)."""
    rng = random.Random(seed)
    prefixes = [[rng.randrange(2**31) for _ in range(rng.choice([512, 1024, 2048]))]
                for _ in range(20)]
    reqs = []
    for i in range(n):
        prompt = list(rng.choice(prefixes)) + [rng.randrange(2**31)
                                               for _ in range(rng.randrange(16, 800))]
        kind = rng.choice(["missing", "ready", "pending"])
        connector = {"kind": kind}
        if kind != "missing":
            connector["hit_tokens"] = min(len(prompt) - 1, rng.randrange(0, len(prompt))) // 16 * 16
        if kind == "pending":
            connector["steps"] = rng.randrange(1, 4)
        reqs.append({"request_id": f"r{i}", "arrival_step": i // 4, "prompt_token_ids": prompt,
                     "output_token_ids": [7] * rng.randrange(1, 300), "connector": connector})
    settings = {"block_size": 16, "num_gpu_blocks": 4096, "max_num_seqs": 256,
                "max_num_batched_tokens": 8192, "max_model_len": 131072,
                "enable_chunked_prefill": True, "enable_prefix_caching": True,
                "long_prefill_token_threshold": 0, "async_scheduling": async_scheduling,
                "scheduler_reserve_full_isl": True, "max_steps": 100000}
    return {"settings": settings, "requests": reqs}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--async-scheduling", action="store_true")
    p.add_argument("--out", required=True)
    a = p.parse_args()
    with open(a.out, "w") as f:
        json.dump(scenario(a.requests, a.seed, a.async_scheduling), f)


if __name__ == "__main__":
    main()
