#!/usr/bin/env python3
"""The `tokenizers` library on the same corpus, one thread (RAYON_NUM_THREADS=1, encode() per
line, as the C side). usage: bench_tokenizer.py TOKENIZER_DIR CORPUS.jsonl [REPEAT]"""
import json
import os
import sys
import time

os.environ["RAYON_NUM_THREADS"] = "1"
import tokenizers  # noqa: E402

t0 = time.perf_counter()
tok = tokenizers.Tokenizer.from_file(os.path.join(sys.argv[1], "tokenizer.json"))
load = time.perf_counter() - t0
lines = [json.loads(l).get("text") for l in open(sys.argv[2], encoding="utf-8")]
lines = [l for l in lines if l is not None]
repeat = int(sys.argv[3]) if len(sys.argv) > 3 else 20
nbytes = sum(len(l.encode()) for l in lines)
t0 = time.perf_counter()
n = 0
for _ in range(repeat):
    for l in lines:
        n += len(tok.encode(l, add_special_tokens=False).ids)
s = time.perf_counter() - t0
print("tokenizers  load %.2f s, %.2f MB/s, %.0f tokens/s (%d lines x %d, tokenizers %s)"
      % (load, nbytes * repeat / s / 1e6, n / s, len(lines), repeat, tokenizers.__version__))
