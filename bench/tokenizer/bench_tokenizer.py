#!/usr/bin/env python3
"""The `tokenizers` library on the same inputs as bench_tokenizer.c, one thread
(RAYON_NUM_THREADS=1, encode() per text, as the C side).
usage: bench_tokenizer.py TOKENIZER_DIR CORPUS.jsonl [REPEAT]   (the corpus line by line)
       bench_tokenizer.py --lines TOKENIZER_DIR CORPUS.jsonl    (single 1 KB / 100 KB / 10 MB lines)"""
import json
import os
import sys
import time

os.environ["RAYON_NUM_THREADS"] = "1"
import tokenizers  # noqa: E402

lines_mode = sys.argv[1] == "--lines"
args = sys.argv[2:] if lines_mode else sys.argv[1:]
t0 = time.perf_counter()
tok = tokenizers.Tokenizer.from_file(os.path.join(args[0], "tokenizer.json"))
load = time.perf_counter() - t0
lines = [json.loads(l).get("text") for l in open(args[1], encoding="utf-8")]
lines = [l for l in lines if l is not None]

if lines_mode:
    # the texts joined by "\n", repeated, cut at a character boundary (as long_line() in C)
    joined = "\n".join(lines).encode()
    for size, runs in ((1000, 200), (100 * 1000, 20), (10 * 1000 * 1000, 3)):
        raw = (b"\n".join([joined] * (size // len(joined) + 2)))[:size]
        text = raw.decode("utf-8", "ignore")
        best, n = 1e30, 0
        for _ in range(runs):
            t0 = time.perf_counter()
            n = len(tok.encode(text, add_special_tokens=False).ids)
            best = min(best, time.perf_counter() - t0)
        nbytes = len(text.encode())
        print("tokenizers  line %9d bytes: %8d ids, %9.3f ms, %6.2f MB/s (best of %d, tokenizers %s)"
              % (nbytes, n, best * 1e3, nbytes / best / 1e6, runs, tokenizers.__version__))
    sys.exit(0)

repeat = int(args[2]) if len(args) > 2 else 20
nbytes = sum(len(l.encode()) for l in lines)
t0 = time.perf_counter()
n = 0
for _ in range(repeat):
    for l in lines:
        n += len(tok.encode(l, add_special_tokens=False).ids)
s = time.perf_counter() - t0
print("tokenizers  load %.2f s, %.2f MB/s, %.0f tokens/s (%d lines x %d, tokenizers %s)"
      % (load, nbytes * repeat / s / 1e6, n / s, len(lines), repeat, tokenizers.__version__))
