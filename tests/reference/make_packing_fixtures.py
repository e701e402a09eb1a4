#!/usr/bin/env python3
"""Packing by TRL itself (trl.pack_dataset) for tests/unit/test_packing.c: 1500 sequences (more than
one 1000-row map batch) with a skewed length distribution (most short, a long tail past the pack
length), packed with bfd, bfd_split and wrapped at seq_length 128. Writes
tests/fixtures/packing/input.txt (one sequence per line: its token ids, the first token of each
sequence i holding the consecutive ids start_i .. start_i + len_i - 1) as lengths.txt (one length per
line), and <strategy>.txt: one packed row per line, "seq_lengths | first id of each sequence"
(the ids being consecutive, the first id and length say which tokens a row holds; every row is
also checked to be consecutive runs here). A second, bimodal distribution (most sequences between
half and the whole pack length, some short, a tenth longer than it) is where the strategies part:
lengths.bimodal.txt and <strategy>.bimodal.txt. fill_rates.txt: per distribution and strategy, TRL's
rows, tokens kept, tokens in, and fill rate (tokens kept / (rows * seq_length)).
Run by hand: python3 tests/reference/make_packing_fixtures.py
"""
import os
import random

from datasets import Dataset
from trl import pack_dataset

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "packing")
SEQ = 128


def skewed_lengths():
    rng = random.Random(11)
    return [min(int(rng.lognormvariate(3.2, 0.9)) + 1, 400) for _ in range(1500)]  # median ~25, tail to 400


def bimodal_lengths():
    rng = random.Random(5)
    lens = []
    for _ in range(1200):
        u = rng.random()
        if u < 0.6:
            lens.append(rng.randint(70, 110))
        elif u < 0.9:
            lens.append(rng.randint(3, 20))
        else:
            lens.append(rng.randint(130, 500))
    return lens


def pack_and_write(name, lengths, suffix, summary):
    seqs, nxt = [], 0
    for n in lengths:
        seqs.append(list(range(nxt, nxt + n)))
        nxt += n
    with open(os.path.join(OUT, "lengths" + suffix + ".txt"), "w") as f:
        for s in seqs:
            f.write("%d\n" % len(s))
    for strategy in ("bfd", "bfd_split", "wrapped"):
        ds = pack_dataset(Dataset.from_dict({"input_ids": seqs}), SEQ, strategy)
        with open(os.path.join(OUT, strategy + suffix + ".txt"), "w") as f:
            for row in ds:
                ids = row["input_ids"]
                lens = row.get("seq_lengths", [len(ids)])
                firsts, at = [], 0
                for n in lens:
                    if strategy != "wrapped":  # each sequence is a consecutive run
                        assert ids[at:at + n] == list(range(ids[at], ids[at] + n))
                    firsts.append(ids[at])
                    at += n
                if strategy == "wrapped":  # a block is consecutive ids across sequence ends
                    assert ids == list(range(ids[0], ids[0] + len(ids)))
                f.write(" ".join(map(str, lens)) + " | " + " ".join(map(str, firsts)) + "\n")
        tokens = sum(len(r["input_ids"]) for r in ds)
        fill = tokens / (len(ds) * SEQ)
        summary.append("%s %s %d %d %d %.17g" % (name, strategy, len(ds), tokens, sum(lengths), fill))
        print(name, strategy, len(ds), "rows, fill rate %.4f" % fill)


def main():
    os.makedirs(OUT, exist_ok=True)
    summary = []
    pack_and_write("skewed", skewed_lengths(), "", summary)
    pack_and_write("bimodal", bimodal_lengths(), ".bimodal", summary)
    with open(os.path.join(OUT, "fill_rates.txt"), "w") as f:
        f.write("# distribution strategy rows tokens_kept tokens_in fill_rate (from trl.pack_dataset)\n")
        f.write("\n".join(summary) + "\n")


if __name__ == "__main__":
    main()
