#!/usr/bin/env python3
"""Where an SFT step's GPU time goes: bench_sft_cuda.py's model and data (a Qwen2.5-0.5B-shaped
model with fewer layers, so that the profile is short), `ctrl train` once plainly (the step's wall
time from its metrics) and once under Nsight Compute with one metric, gpu__time_duration (each
kernel's time on the GPU, kernels serialised), summed per kernel name and per step.
Printed: the wall time of a steady step, the GPU time its kernels take, their ratio (how much of
the step the GPU is busy: the rest is the host launching, synchronising and allocating), and the
kernels that take the most time with their share.
--host-samples N: where the host spends the step (no perf or gdb there, but cuda-gdb attaches to a
running process): N stack samples of a longer `ctrl train`, each function counted once per sample
it appears in (inclusive), so a function in every sample holds the step's whole wall time.
usage: bench/cuda/profile_sft.py --build build-gpu --tokenizer DIR [--layers 4 --batch 4 --seq 2048
       --dtype bf16 --steps 2 --top 25 --host-samples 0 --names demangled]
CTRL_CUDA_GEMM_LOG=1 in the environment makes ctrl print each distinct cuBLASLt problem of the run
once, with the algorithm the heuristic chose (kernels/cuda/gemm.cu)."""
import argparse
import collections
import csv
import io
import json
import os
import shutil
import subprocess
import re
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_sft_cuda as sft  # noqa: E402  (the model, data and environment of the SFT bench)


def write_ini(path, d, out, a, steps):
    with open(path, "w") as f:
        f.write(f"""[run]
output_dir = {out}
device = cuda
[model]
path = {d}/model
attention = {a.attention}
[data]
train_file = {d}/train.jsonl
max_length = {a.seq}
shuffle = false
[train]
dtype = {a.dtype}
learning_rate = 1e-4
max_steps = {steps}
per_device_train_batch_size = {a.batch}
logging_steps = 1
save_strategy = no
""")


def ctrl_cmd(a, ini):
    return [os.path.join(a.build, "ctrl"), "--plugin-dir", os.path.join(a.build, "plugins"), "train", ini]


def kernel_times(log):
    """{kernel name: [launches, total ns]} from ncu's CSV (--csv --print-units base)."""
    text = open(log, errors="replace").read()
    start = text.find('"ID","Process ID"')
    if start < 0:
        return None
    per = collections.defaultdict(lambda: [0, 0.0])
    for row in csv.DictReader(io.StringIO(text[start:])):
        if row.get("Metric Name") != "gpu__time_duration.sum":
            continue
        k = per[row["Kernel Name"]]
        k[0] += 1
        k[1] += float(row["Metric Value"].replace(",", ""))
    return per


def host_samples(a, d, env, n):
    """Inclusive counts of the functions on the main thread's stack over n cuda-gdb samples of a
    `ctrl train` in its steady state."""
    gdb = shutil.which("cuda-gdb")
    if not gdb:
        print("host samples: cuda-gdb not found")
        return
    ini = os.path.join(d, "host.ini")
    write_ini(ini, d, os.path.join(d, "host"), a, 1000)
    proc = subprocess.Popen(ctrl_cmd(a, ini), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    metrics = os.path.join(d, "host", "metrics.jsonl")
    t0 = time.time()
    while time.time() - t0 < 60 and proc.poll() is None:  # past the first two steps
        if os.path.exists(metrics) and sum(1 for _ in open(metrics)) >= 3:
            break
        time.sleep(0.2)
    counts, got, first = collections.Counter(), 0, None
    for _ in range(n):
        if proc.poll() is not None:
            break
        r = subprocess.run([gdb, "-q", "-batch", "-p", str(proc.pid), "-ex", "bt 40"], capture_output=True,
                           text=True, timeout=60)
        names = []
        for line in r.stdout.splitlines():
            m = re.match(r"#\d+\s+(?:0x[0-9a-f]+ in )?([^\s(]+)", line)
            if m:
                names.append(m.group(1))
        if not names:
            first = first or (r.stdout + r.stderr)[-1500:]
            continue
        got += 1
        counts.update(set(names))
        if got == 1:
            print("host sample 1:\n  " + "\n  ".join(names[:25]))
    proc.kill()
    proc.wait()
    if not got:
        print(f"host samples: none ({first})")
        return
    print(f"host: {got} samples of the main thread; functions by the share of samples they are in")
    for name, k in counts.most_common(a.top + 15):
        print(f"  {k / got:6.0%}  {name[:100]}")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", default=os.path.join(sft.ROOT, "build-gpu"))
    p.add_argument("--tokenizer", default=os.path.join(sft.ROOT, "tests", "fixtures", "tokenizer", "tiny_bpe"))
    p.add_argument("--hidden", type=int, default=896)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=14)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--intermediate", type=int, default=4864)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--dtype", default="bf16")
    p.add_argument("--attention", default="flash")
    p.add_argument("--steps", type=int, default=2, help="steps profiled (after a plain run of steps + 2)")
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--host-samples", type=int, default=0)
    p.add_argument("--no-ncu", action="store_true", help="no per-kernel profile (host samples only)")
    p.add_argument("--names", default="demangled", choices=["function", "demangled"],
                   help="kernel names as ncu prints them: demangled keeps the template arguments (which "
                        "cuBLAS kernel a `Kernel2` is: its tile, layout and alignment); function the bare name")
    p.add_argument("--name-width", type=int, default=160)
    p.add_argument("--timeout", type=int, default=240)
    a = p.parse_args()
    ncu = None if a.no_ncu else shutil.which("ncu")
    env = sft.ctrl_env()
    with tempfile.TemporaryDirectory() as d:
        subprocess.run([os.path.join(a.build, "ctrl"), "--plugin-dir", os.path.join(a.build, "plugins"),
                        "model", "init", "--arch", "qwen2", "--hidden", str(a.hidden), "--layers", str(a.layers),
                        "--heads", str(a.heads), "--kv-heads", str(a.kv_heads), "--intermediate",
                        str(a.intermediate), "--tie-embeddings", "--tokenizer", a.tokenizer, "--out",
                        os.path.join(d, "model")], check=True, stdout=subprocess.DEVNULL, env=env)
        plain_steps = a.steps + 2
        sft.make_data(os.path.join(d, "train.jsonl"), os.path.join(d, "model"), a.batch * plain_steps, a.seq)
        print(f"profile: qwen2 hidden {a.hidden} x {a.layers} layers, {a.dtype}, batch {a.batch} x {a.seq}, "
              f"attention {a.attention}")
        ini = os.path.join(d, "plain.ini")
        write_ini(ini, d, os.path.join(d, "plain"), a, plain_steps)
        r = subprocess.run(ctrl_cmd(a, ini), capture_output=True, text=True, timeout=a.timeout, env=env)
        if r.returncode != 0:
            print(f"ctrl: exit {r.returncode}\n{r.stderr[-3000:]}")
            return 1
        rows = [json.loads(l) for l in open(os.path.join(d, "plain", "metrics.jsonl")) if '"loss"' in l]
        steady = rows[2:] if len(rows) > 2 else rows
        tps = sum(x["tokens_per_second"] for x in steady) / len(steady)
        step_ms = a.batch * (a.seq - 1) / tps * 1e3
        print(f"wall: {step_ms:.1f} ms per steady step ({tps:.0f} tokens/s)")
        if a.host_samples:
            host_samples(a, d, env, a.host_samples)
        if not ncu:
            print("no per-kernel profile (ncu not found or --no-ncu)")
            return 0
        ini = os.path.join(d, "prof.ini")
        write_ini(ini, d, os.path.join(d, "prof"), a, a.steps)
        log = os.path.join(d, "ncu.csv")
        cmd = [ncu, "--clock-control", "none", "--cache-control", "none", "--metrics", "gpu__time_duration.sum",
               "--csv", "--print-units", "base", "--print-kernel-base", a.names, "--log-file", log] + ctrl_cmd(a, ini)
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout, env=env)
        per = kernel_times(log) if os.path.exists(log) else None
        if r.returncode != 0 or not per:
            print(f"ncu: exit {r.returncode}\n{r.stdout[-1500:]}\n{r.stderr[-1500:]}")
            if os.path.exists(log):
                print(open(log, errors="replace").read()[-1500:])
            return 1
        total = sum(v[1] for v in per.values())
        launches = sum(v[0] for v in per.values())
        gpu_ms = total / a.steps / 1e6
        print(f"gpu: {gpu_ms:.1f} ms of kernels per step ({launches // a.steps} launches), "
              f"{gpu_ms / step_ms:.0%} of the wall step (the profiled steps include the first)")
        print(f"{'ms/step':>9} {'share':>6} {'launches':>8}  kernel")
        for name, (n, ns) in sorted(per.items(), key=lambda kv: -kv[1][1])[:a.top]:
            print(f"{ns / a.steps / 1e6:9.2f} {ns / total:6.1%} {n // a.steps:8d}  {name[:a.name_width]}")
        conv = [(n, ns) for name, (n, ns) in per.items() if "f32_to_bf16" in name or "round_bf16" in name]
        print(f"fp32 -> bf16 conversions: {sum(ns for _, ns in conv) / a.steps / 1e6:.2f} ms, "
              f"{sum(n for n, _ in conv) // a.steps} launches per step")
    return 0


if __name__ == "__main__":
    sys.exit(main())
