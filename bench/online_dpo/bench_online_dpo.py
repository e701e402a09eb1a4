"""Online DPO steps, ctrl against TRL 1.16's OnlineDPOTrainer (transformers generation, CPU), same
model and settings, in the same run: step time split into generation / reward / reference log-probs
/ policy forward + backward, and each trainer's peak RSS.

Both start from the same random-initialized Qwen2-shaped model (ctrl model init, 0.75M parameters,
the project's tiny BPE tokenizer), the quickstart's arithmetic prompts, the length reward (TRL's
reward_len with target 20), 8 prompts x 2 completions per step, max_new_tokens 48, temperature 1.0,
sigmoid loss with beta 0.1 against a frozen reference copy, fp32, 2 threads, each trainer's default
activation checkpointing (TRL's gradient_checkpointing, ctrl's `checkpointing` strategy). The first
step is a warm-up and not counted. ctrl's split comes from its timing/* metrics, TRL's from wrapping
`_generate`, `_calculate_rewards_from_functions` and `_forward` (policy and reference); peak RSS is
ctrl's process (RUSAGE_CHILDREN) and this Python process for TRL (it holds nothing else).

    python3 bench/online_dpo/bench_online_dpo.py [--steps N] [--ctrl build/ctrl]
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def ctrl_run(args, work, model, data):
    ini = os.path.join(work, "online_dpo.ini")
    out = os.path.join(work, "ctrl-out")
    with open(ini, "w") as f:
        f.write(f"""[run]
trainer = online_dpo
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
per_device_train_batch_size = 8
logging_steps = 1
save_strategy = no
[generation]
kv_cache_bytes = 256000000
temperature = 1.0
[online_dpo]
max_new_tokens = {args.max_new_tokens}
beta = 0.1
[reward.len]
plugin = length
target_length = 20
""")
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), OMP_WAIT_POLICY="PASSIVE")
    subprocess.run([args.ctrl, "--plugin-dir", args.plugins, "train", ini], check=True, env=env,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    rows = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl")) if '"loss"' in l][1:]  # warm-up
    n = len(rows)
    mean = lambda k: sum(r.get(k) or 0 for r in rows) / n
    return {"step_s": mean("step_time"), "generation_s": mean("timing/generation_s"),
            "reward_s": mean("timing/reward_s"), "ref_s": mean("timing/old_ref_logprob_s"),
            "fwd_bwd_s": mean("timing/forward_backward_s"), "peak_rss_mib": rss,
            "scores": rows[-1]["objective/scores"], "mean_length": mean("completions/mean_length")}


def trl_run(args, work, model, data):
    import torch
    from datasets import load_dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl.experimental.online_dpo import OnlineDPOConfig, OnlineDPOTrainer

    torch.set_num_threads(args.threads)
    tok = AutoTokenizer.from_pretrained(os.path.join(ROOT, "tests/fixtures/tokenizer/tiny_bpe"))
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    ds = load_dataset("json", data_files=os.path.join(data, "train_prompts.jsonl"), split="train")

    def reward_len(completions, **kw):
        return [-abs(20 - len(c)) for c in completions]

    cfg = OnlineDPOConfig(output_dir=os.path.join(work, "trl-out"), per_device_train_batch_size=8,
                          max_new_tokens=args.max_new_tokens, temperature=1.0, beta=0.1, learning_rate=1e-3,
                          lr_scheduler_type="constant", max_steps=args.steps, logging_steps=1, bf16=False,
                          use_cpu=True, report_to=[], save_strategy="no", seed=42, dataloader_num_workers=0)
    m = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    tr = OnlineDPOTrainer(model=m, reward_funcs=[reward_len], args=cfg, train_dataset=ds, processing_class=tok)
    times = {"generation_s": 0.0, "reward_s": 0.0, "forward_s": 0.0}

    def timed(obj, name, key):
        f = getattr(obj, name)

        def wrapper(*a, **k):
            t = time.perf_counter()
            r = f(*a, **k)
            times[key] += time.perf_counter() - t
            return r
        setattr(obj, name, wrapper)
    timed(tr, "_generate", "generation_s")
    timed(tr, "_calculate_rewards_from_functions", "reward_s")
    timed(tr, "_forward", "forward_s")
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
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    logs = [h for h in tr.state.log_history if "objective/scores" in h]
    steps = steps[1:]
    n = len(steps)
    return {"step_s": sum(steps) / n, "generation_s": times["generation_s"] / n, "reward_s": times["reward_s"] / n,
            "forward_s": times["forward_s"] / n, "peak_rss_mib": rss, "scores": logs[-1]["objective/scores"]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=11)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--ctrl", default=os.path.join(ROOT, "build/ctrl"))
    ap.add_argument("--plugins", default=os.path.join(ROOT, "build/plugins"))
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="ctrl-bench-odpo-")
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
    print(f"Online DPO, {args.steps} steps (first not counted), 8 prompts x 2 completions x <= "
          f"{args.max_new_tokens} tokens, {args.threads} threads")
    print(f"{'':28}{'ctrl':>10}{'TRL':>10}{'TRL/ctrl':>10}")
    for k, label in [("step_s", "step (s)"), ("generation_s", "generation (s)"), ("reward_s", "reward (s)"),
                     ("peak_rss_mib", "peak RSS (MiB)")]:
        print(f"{label:28}{c[k]:10.4f}{t[k]:10.4f}{t[k] / max(c[k], 1e-9):10.2f}")
    print(f"{'ref (ctrl) / fwd pol+ref (TRL)':28}{c['ref_s']:10.4f}{t['forward_s']:10.4f}")
    print(f"{'fwd+bwd policy (ctrl)':28}{c['fwd_bwd_s']:10.4f}")
    print(json.dumps({"ctrl": c, "trl": t, "speedup": t["step_s"] / c["step_s"],
                      "rss_ratio": c["peak_rss_mib"] / t["peak_rss_mib"]}))


if __name__ == "__main__":
    sys.exit(main())
