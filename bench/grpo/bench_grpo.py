"""One GRPO step, ctrl against TRL's GRPOTrainer (transformers generation, CPU), same model and
settings, in the same run: total step time split into generation / reward / log-prob forward /
backward + optimizer.

Both start from the same random-initialized Qwen2-shaped model (ctrl model init, 0.75M
parameters, the project's tiny BPE tokenizer), the quickstart's arithmetic prompts, the length
reward (TRL's reward_len with target 20), 16 completions per step (2 prompts x num_generations 8),
max_completion_length 48 (--max-completion-length), temperature 1.0, fp32, 2 threads, activation checkpointing on both
(TRL's default), no reference model (beta = 0).

    python3 bench/grpo/bench_grpo.py [--steps N] [--ctrl build/ctrl]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def ctrl_run(args, work, model, data):
    ini = os.path.join(work, "grpo.ini")
    out = os.path.join(work, "ctrl-out")
    with open(ini, "w") as f:
        f.write(f"""[run]
trainer = grpo
output_dir = {out}
seed = 42
device = cpu
[model]
path = {model}
[data]
train_file = {data}/train_prompts.jsonl
[train]
dtype = fp32
learning_rate = 1e-3
lr_scheduler_type = constant
max_steps = {args.steps}
per_device_train_batch_size = 16
logging_steps = 1
save_strategy = no
[generation]
kv_cache_bytes = 256000000
temperature = 1.0
[grpo]
num_generations = 8
max_completion_length = {args.max_completion_length}
[reward.len]
plugin = length
target_length = 20
""")
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    subprocess.run([args.ctrl, "--plugin-dir", args.plugins, "train", ini], check=True, env=env,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rows = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl")) if '"loss"' in l][1:]  # warm
    n = len(rows)
    mean = lambda k: sum(r.get(k) or 0 for r in rows) / n
    # per step: one generation batch; forward_backward is reported per micro-batch (one per step here)
    return {"step_s": mean("step_time"), "generation_s": mean("timing/generation_s"), "reward_s": mean("timing/reward_s"),
            "fwd_bwd_s": mean("timing/forward_backward_s"), "reward": rows[-1]["reward"],
            "mean_length": mean("completions/mean_length")}


def trl_run(args, work, model, data):
    import torch
    from datasets import load_dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(args.threads)
    tok = AutoTokenizer.from_pretrained(os.path.join(ROOT, "tests/fixtures/tokenizer/tiny_bpe"))
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    ds = load_dataset("json", data_files=os.path.join(data, "train_prompts.jsonl"), split="train")

    def reward_len(completions, **kw):
        return [-abs(20 - len(c)) for c in completions]

    cfg = GRPOConfig(output_dir=os.path.join(work, "trl-out"), per_device_train_batch_size=16, num_generations=8,
                     max_completion_length=args.max_completion_length, temperature=1.0, learning_rate=1e-3, lr_scheduler_type="constant",
                     max_steps=args.steps, logging_steps=1, bf16=False, use_cpu=True, report_to=[],
                     save_strategy="no", seed=42, dataloader_num_workers=0)
    m = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    tr = GRPOTrainer(model=m, reward_funcs=[reward_len], args=cfg, train_dataset=ds, processing_class=tok)
    times = {"generation_s": 0.0, "reward_s": 0.0, "fwd_s": 0.0}

    def timed(obj, name, key):
        f = getattr(obj, name)

        def wrapper(*a, **k):
            t = time.perf_counter()
            r = f(*a, **k)
            times[key] += time.perf_counter() - t
            return r
        setattr(obj, name, wrapper)
    timed(tr, "_generate", "generation_s")
    timed(tr, "_calculate_rewards", "reward_s")
    timed(tr, "compute_loss", "fwd_s")
    steps = []

    class Clock(TrainerCallback):
        def on_step_begin(self, a, s, c, **k):
            steps.append(time.perf_counter())
            if len(steps) == 2:
                times.update({k: 0.0 for k in times})  # the first step is a warm-up

        def on_step_end(self, a, s, c, **k):
            steps[-1] = time.perf_counter() - steps[-1]
    tr.add_callback(Clock())
    tr.train()
    logs = [h for h in tr.state.log_history if "reward" in h][1:]  # after a warm-up step, as for ctrl
    steps = steps[1:]
    n = len(steps)
    return {"step_s": sum(h["step_time"] for h in logs) / len(logs), "generation_s": times["generation_s"] / n, "reward_s": times["reward_s"] / n,
            "fwd_s": times["fwd_s"] / n, "reward": logs[-1]["reward"],
            "mean_length": sum(h["completions/mean_length"] for h in logs) / len(logs)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-completion-length", type=int, default=48)
    ap.add_argument("--ctrl", default=os.path.join(ROOT, "build/ctrl"))
    ap.add_argument("--plugins", default=os.path.join(ROOT, "build/plugins"))
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="ctrl-bench-grpo-")
    data = os.path.join(work, "data")
    model = os.path.join(work, "model")
    subprocess.run(["bash", os.path.join(ROOT, "scripts/make_quickstart_data.sh"), data], check=True,
                   stdout=subprocess.DEVNULL)
    subprocess.run([args.ctrl, "--plugin-dir", args.plugins, "model", "init", "--arch", "qwen2", "--hidden", "128",
                    "--layers", "2", "--heads", "4", "--kv-heads", "2", "--tokenizer",
                    os.path.join(ROOT, "tests/fixtures/tokenizer/tiny_bpe"), "--out", model], check=True,
                   stdout=subprocess.DEVNULL)
    c = ctrl_run(args, work, model, data)
    t = trl_run(args, work, model, data)
    print(f"GRPO step, {args.steps} steps, 16 completions x <= {args.max_completion_length} tokens, "
          f"{args.threads} threads")
    print(f"{'':22}{'ctrl':>10}{'TRL':>10}{'ratio':>8}")
    for k, label in [("step_s", "step (s)"), ("generation_s", "generation (s)"), ("reward_s", "reward (s)")]:
        print(f"{label:22}{c[k]:10.4f}{t[k]:10.4f}{t[k] / max(c[k], 1e-9):8.1f}x")
    print(f"{'fwd+bwd (ctrl) / fwd (TRL)':22}{c['fwd_bwd_s']:10.4f}{t['fwd_s']:10.4f}")
    print(f"{'mean completion length':22}{c['mean_length']:10.1f}{t['mean_length']:10.1f}")
    print(json.dumps({"ctrl": c, "trl": t, "speedup": t["step_s"] / c["step_s"]}))


if __name__ == "__main__":
    sys.exit(main())
