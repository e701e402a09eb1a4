#!/usr/bin/env python3
"""Where a program's CPU time went, from bench/common/pc_sample.c's samples: each sample's module and
file offset resolved to the function containing it (the module's symbol table read with nm, the file
offset turned into an address through its program headers, read with readelf), self time by
function, largest first. Files whose command line lacks --match TEXT are left out.
usage: pc_report.py SAMPLES_FILE... [--top N] [--match TEXT]"""
import bisect
import collections
import os
import subprocess
import sys


def option(name, default):
    return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else default


def segments(module):
    """(file offset, size, address) of each loadable segment."""
    out = subprocess.run(["readelf", "-lW", module], capture_output=True, text=True).stdout
    return [(int(f[1], 16), int(f[4], 16), int(f[2], 16)) for f in (line.split() for line in out.splitlines())
            if f and f[0] == "LOAD"]


def symbols(module):
    nm = ["nm", "-C", "--defined-only", "-n", module]
    out = subprocess.run(nm, capture_output=True, text=True).stdout
    if not out.strip():  # a stripped library: its dynamic symbols
        out = subprocess.run(nm[:1] + ["-D"] + nm[1:], capture_output=True, text=True).stdout
    syms = []
    for line in out.splitlines():
        f = line.split(" ", 2)
        if len(f) == 3 and f[1].lower() in "tw":
            syms.append((int(f[0], 16), f[2]))
    return syms


def resolver(module):
    try:
        segs, syms = segments(module), symbols(module)
    except (OSError, ValueError):
        return lambda off: "??"
    addrs = [a for a, _ in syms]

    def name(off):
        addr = next((a + off - o for o, n, a in segs if o <= off < o + n), off)
        i = bisect.bisect_right(addrs, addr) - 1
        return syms[i][1] if i >= 0 else "??"
    return name


def main():
    skip = {"--top", "--match"}
    files = [a for i, a in enumerate(sys.argv[1:], 1) if not a.startswith("--") and sys.argv[i - 1] not in skip]
    top, match = int(option("--top", 40)), option("--match", "")
    by_module = collections.defaultdict(collections.Counter)
    for path in files:
        lines = open(path).read().splitlines()
        cmd = lines[0].split("\t", 1)[1] if lines and lines[0].startswith("#cmd") else ""
        if match not in cmd:
            continue
        print(f"{path}: {len(lines) - 1} samples: {cmd[:160]}")
        for line in lines[1:]:
            module, off = line.split("\t")
            by_module[module][int(off, 16)] += 1
    total = sum(sum(c.values()) for c in by_module.values()) or 1
    funcs = collections.Counter()
    for module, offsets in by_module.items():
        name = resolver(module) if os.path.isfile(module) else (lambda off: "??")
        for off, n in offsets.items():
            funcs[f"{name(off)}  [{os.path.basename(module)}]"] += n
    print(f"{total} samples (1 ms of CPU each), self time by function:")
    for fn, n in funcs.most_common(top):
        print(f"  {100.0 * n / total:5.1f}%  {n:7d}  {fn[:150]}")
    mods = collections.Counter({os.path.basename(m): sum(c.values()) for m, c in by_module.items()})
    print("by module: " + ", ".join(f"{m} {100.0 * n / total:.1f}%" for m, n in mods.most_common(8)))


if __name__ == "__main__":
    main()
