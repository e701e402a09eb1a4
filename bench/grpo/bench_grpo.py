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
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
import bench_util as bu  # noqa: E402


def ctrl_run(args, work, model, data):
    ini = os.path.join(work, "grpo.ini")
    out = os.path.join(work, "ctrl-out")
    bu.quickstart_online_ini(ini, "grpo", out, model, data, args.steps, 16,
                             {"num_generations": 8, "max_completion_length": args.max_completion_length})
    bu.ctrl_train(args.ctrl, args.plugins, ini, bu.thread_env(args.threads))
    rows = bu.metrics(out)[1:]  # after a warm-up step
    mean = bu.mean_of(rows)
    # per step: one generation batch; forward_backward is reported per micro-batch (one per step here)
    return {"step_s": mean("step_time"), "generation_s": mean("timing/generation_s"), "reward_s": mean("timing/reward_s"),
            "fwd_bwd_s": mean("timing/forward_backward_s"), "reward": rows[-1]["reward"],
            "mean_length": mean("completions/mean_length")}


def trl_run(args, work, model, data):
    import torch
    from datasets import load_dataset
    from transformers import AutoModelForCausalLM
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(args.threads)
    tok = bu.tokenizer_with_pad(bu.TINY_TOKENIZER)
    ds = load_dataset("json", data_files=os.path.join(data, "train_prompts.jsonl"), split="train")
    cfg = GRPOConfig(**bu.trl_args(output_dir=os.path.join(work, "trl-out"), per_device_train_batch_size=16,
                                   num_generations=8, max_completion_length=args.max_completion_length,
                                   temperature=1.0, learning_rate=1e-3, lr_scheduler_type="constant",
                                   max_steps=args.steps, logging_steps=1, seed=42))
    m = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    tr = GRPOTrainer(model=m, reward_funcs=[bu.reward_len], args=cfg, train_dataset=ds, processing_class=tok)
    times = {"generation_s": 0.0, "reward_s": 0.0, "fwd_s": 0.0}
    bu.timed(tr, "_generate", times, "generation_s")
    bu.timed(tr, "_calculate_rewards", times, "reward_s")
    bu.timed(tr, "compute_loss", times, "fwd_s")
    steps = []
    tr.add_callback(bu.step_clock(times, steps))  # the first step is a warm-up
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
    ap.add_argument("--ctrl", default=os.path.join(bu.ROOT, "build/ctrl"))
    ap.add_argument("--plugins", default=os.path.join(bu.ROOT, "build/plugins"))
    args = ap.parse_args()
    work, model, data = bu.quickstart_model(args, "ctrl-bench-grpo-")
    c = ctrl_run(args, work, model, data)
    t = trl_run(args, work, model, data)
    print(f"GRPO step, {args.steps} steps, 16 completions x <= {args.max_completion_length} tokens, "
          f"{args.threads} threads")
    bu.print_ratio_table(c, t, [("step_s", "step (s)"), ("generation_s", "generation (s)"), ("reward_s", "reward (s)")],
                         22)
    print(f"{'fwd+bwd (ctrl) / fwd (TRL)':22}{c['fwd_bwd_s']:10.4f}{t['fwd_s']:10.4f}")
    print(f"{'mean completion length':22}{c['mean_length']:10.1f}{t['mean_length']:10.1f}")
    print(json.dumps({"ctrl": c, "trl": t, "speedup": t["step_s"] / c["step_s"]}))


if __name__ == "__main__":
    sys.exit(main())
