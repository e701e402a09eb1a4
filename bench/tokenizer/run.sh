#!/usr/bin/env bash
# Tokenizer throughput on one thread, ctrl against the `tokenizers` library, for each shared
# tokenizer (byte-level Qwen3 and Llama-3, SentencePiece-style Llama-2), pairs run back to back
# ROUNDS times (single runs vary on a busy machine; compare medians); then single lines of 1 KB,
# 100 KB and 10 MB per tokenizer (best of several runs each; LINES=0 skips them).
# usage: [BUILD=build-dir] bench/tokenizer/run.sh [ROUNDS] [REPEAT]   (after scripts/build.sh;
# needs python3 with tokenizers and ../shared/data/tokenizers)
set -euo pipefail
cd "$(dirname "$0")/../.."
ROUNDS=${1:-3}
REPEAT=${2:-20}
BUILD=${BUILD:-build}
SHARED=../shared/data/tokenizers
CORPUS=tests/fixtures/tokenizer/corpus.jsonl
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); $(date -u +%F)"
for name in qwen3 llama3 llama2; do
    [ -f "$SHARED/$name/tokenizer.json" ] || { echo "$name: absent, skipped"; continue; }
    for _ in $(seq "$ROUNDS"); do
        echo "$name $("$BUILD"/bench_tokenizer "$SHARED/$name" "$CORPUS" "$REPEAT")"
        echo "$name $(python3 bench/tokenizer/bench_tokenizer.py "$SHARED/$name" "$CORPUS" "$REPEAT")"
    done
done
[ "${LINES:-1}" = 0 ] && exit 0
for name in qwen3 llama3 llama2; do
    [ -f "$SHARED/$name/tokenizer.json" ] || continue
    "$BUILD"/bench_tokenizer --lines "$SHARED/$name" "$CORPUS" | sed "s/^/$name /"
    python3 bench/tokenizer/bench_tokenizer.py --lines "$SHARED/$name" "$CORPUS" | sed "s/^/$name /"
done
