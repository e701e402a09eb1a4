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
ctrl's own process (wait4) and this Python process for TRL (it holds nothing else).

    python3 bench/online_dpo/bench_online_dpo.py [--steps N] [--ctrl build/ctrl]
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
import bench_util as bu  # noqa: E402


def ctrl_run(args, work, model, data):
    ini = os.path.join(work, "online_dpo.ini")
    out = os.path.join(work, "ctrl-out")
    bu.quickstart_online_ini(ini, "online_dpo", out, model, data, args.steps, 8,
                             {"max_new_tokens": args.max_new_tokens, "beta": 0.1})
    rss = bu.ctrl_train(args.ctrl, args.plugins, ini, bu.thread_env(args.threads, OMP_WAIT_POLICY="PASSIVE")).rss_mib
    rows = bu.metrics(out)[1:]  # warm-up
    mean = bu.mean_of(rows)
    return {"step_s": mean("step_time"), "generation_s": mean("timing/generation_s"),
            "reward_s": mean("timing/reward_s"), "ref_s": mean("timing/old_ref_logprob_s"),
            "fwd_bwd_s": mean("timing/forward_backward_s"), "peak_rss_mib": rss,
            "scores": rows[-1]["objective/scores"], "mean_length": mean("completions/mean_length")}


def trl_run(args, work, model, data):
    import torch
    from datasets import load_dataset
    from transformers import AutoModelForCausalLM
    from trl.experimental.online_dpo import OnlineDPOConfig, OnlineDPOTrainer

    torch.set_num_threads(args.threads)
    tok = bu.tokenizer_with_pad(bu.TINY_TOKENIZER)
    ds = load_dataset("json", data_files=os.path.join(data, "train_prompts.jsonl"), split="train")
    cfg = OnlineDPOConfig(**bu.trl_args(output_dir=os.path.join(work, "trl-out"), per_device_train_batch_size=8,
                                        max_new_tokens=args.max_new_tokens, temperature=1.0, beta=0.1,
                                        learning_rate=1e-3, lr_scheduler_type="constant", max_steps=args.steps,
                                        logging_steps=1, seed=42))
    m = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    tr = OnlineDPOTrainer(model=m, reward_funcs=[bu.reward_len], args=cfg, train_dataset=ds, processing_class=tok)
    times = {"generation_s": 0.0, "reward_s": 0.0, "forward_s": 0.0}
    bu.timed(tr, "_generate", times, "generation_s")
    bu.timed(tr, "_calculate_rewards_from_functions", times, "reward_s")
    bu.timed(tr, "_forward", times, "forward_s")
    steps = []
    tr.add_callback(bu.step_clock(times, steps))  # the first step is a warm-up
    tr.train()
    rss = bu.peak_rss_self()
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
    ap.add_argument("--ctrl", default=os.path.join(bu.ROOT, "build/ctrl"))
    ap.add_argument("--plugins", default=os.path.join(bu.ROOT, "build/plugins"))
    args = ap.parse_args()
    work, model, data = bu.quickstart_model(args, "ctrl-bench-odpo-")
    c = ctrl_run(args, work, model, data)
    t = trl_run(args, work, model, data)
    print(f"Online DPO, {args.steps} steps (first not counted), 8 prompts x 2 completions x <= "
          f"{args.max_new_tokens} tokens, {args.threads} threads")
    bu.print_ratio_table(c, t, [("step_s", "step (s)"), ("generation_s", "generation (s)"), ("reward_s", "reward (s)"),
                                ("peak_rss_mib", "peak RSS (MiB)")], 28, "TRL/ctrl", "10.2f", "")
    print(f"{'ref (ctrl) / fwd pol+ref (TRL)':28}{c['ref_s']:10.4f}{t['forward_s']:10.4f}")
    print(f"{'fwd+bwd policy (ctrl)':28}{c['fwd_bwd_s']:10.4f}")
    print(json.dumps({"ctrl": c, "trl": t, "speedup": t["step_s"] / c["step_s"],
                      "rss_ratio": c["peak_rss_mib"] / t["peak_rss_mib"]}))


if __name__ == "__main__":
    sys.exit(main())
