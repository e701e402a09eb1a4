#!/usr/bin/env python3
"""Logits processing by transformers' own processors (RepetitionPenalty, Temperature, TopK, TopP,
MinP, in generate's order) for tests/unit/test_sampling.c: random logits over 64 tokens, a grid of
parameters, and the processed log-probabilities (log_softmax of the processed logits; null where a
token is filtered out). Writes tests/fixtures/sampling/cases.jsonl. Run by hand."""
import json
import os

import torch
from transformers.generation.logits_process import (LogitsProcessorList, MinPLogitsWarper,
                                                    RepetitionPenaltyLogitsProcessor, TemperatureLogitsWarper,
                                                    TopKLogitsWarper, TopPLogitsWarper)

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "sampling", "cases.jsonl")
V = 64


def main():
    g = torch.Generator().manual_seed(5)
    grid = [dict(temperature=t, top_k=k, top_p=p, min_p=m, repetition_penalty=r)
            for t in (1.0, 0.7, 1.5) for k in (0, 5) for p in (1.0, 0.9, 0.3) for m in (0.0, 0.1) for r in (1.0, 1.3)]
    with open(OUT, "w") as f:
        for params in grid:
            logits = torch.randn(1, V, generator=g) * 2
            seen = torch.randint(0, V, (1, 12), generator=g)
            procs = LogitsProcessorList()
            if params["repetition_penalty"] != 1.0:
                procs.append(RepetitionPenaltyLogitsProcessor(params["repetition_penalty"]))
            if params["temperature"] != 1.0:
                procs.append(TemperatureLogitsWarper(params["temperature"]))
            if params["top_k"] > 0:
                procs.append(TopKLogitsWarper(params["top_k"]))
            if params["top_p"] < 1.0:
                procs.append(TopPLogitsWarper(params["top_p"]))
            if params["min_p"] > 0:
                procs.append(MinPLogitsWarper(params["min_p"]))
            out = procs(seen, logits.clone())
            lp = torch.log_softmax(out.double(), dim=-1)[0]
            f.write(json.dumps({"params": params, "logits": logits[0].tolist(), "seen": seen[0].tolist(),
                                "logprobs": [None if torch.isinf(x) else float(x) for x in lp]}) + "\n")
    print(len(grid), "cases")


if __name__ == "__main__":
    main()
