"""One LoRA-GRPO step, ctrl against TRL's GRPOTrainer with a PEFT adapter, same model, data and
settings: wall seconds and CPU seconds per step (the machine is shared: CPU time says what the step
cost whatever else ran), and each process's peak RSS.

Both train LoRA adapters (r 16, alpha 32, q/k/v/o_proj, dropout 0, PEFT's default init) on the same
random-initialized Qwen2-shaped model (`ctrl model init`, the project's tiny BPE tokenizer; --shape
0.5b: Qwen2.5-0.5B's hidden 896, 24 layers, 14 heads, 2 KV heads, intermediate 4864), the
quickstart's arithmetic prompts, the length reward (target 20), 16 completions a step (2 prompts x
num_generations 8), max_completion_length 32, temperature 1, fp32, no reference model (beta 0).

How each keeps generation in step with the adapters: ctrl decodes with x W^T + s (x A^T) B^T (the
adapters applied live, nothing merged or copied between steps). TRL without vLLM generates with the
PeftModel (lora.Linear adds the adapter in its forward, as ctrl); with vLLM it merges the adapter into
the base (merge_adapter), reads every weight out for vLLM and unmerges (unmerge_adapter) every step:
that sync is timed on its own on the same model (`sync_s`, without vLLM's load_weights), since vLLM
is not on this machine.

CPU and wall per step: ctrl runs twice (1 step and 1 + --steps), the difference divided by --steps
(start-up and the first step's warm-up netted out); TRL's per step from its steps after the first
(time.process_time over the whole process).

    python3 bench/peft/bench_lora_grpo.py [--steps N] [--threads T] [--shape tiny|0.5b]
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
import bench_util as bu  # noqa: E402

R, ALPHA, TARGETS, GENS, BATCH = 16, 32, ["q_proj", "k_proj", "v_proj", "o_proj"], 8, 16
SHAPES = {"tiny": bu.model_shape(256, 4, 4, 2, 768), "0.5b": bu.model_shape(896, 24, 14, 2, 4864)}


def ctrl_once(args, work, model, data, steps):
    out = os.path.join(work, f"ctrl-out-{steps}")
    ini = bu.quickstart_online_ini(os.path.join(work, f"grpo-{steps}.ini"), "grpo", out, model, data, steps, BATCH,
                                   {"num_generations": GENS, "max_completion_length": args.max_completion_length})
    with open(ini, "a") as f:
        f.write(f"[peft]\nenabled = true\nr = {R}\nlora_alpha = {ALPHA}\nlora_dropout = 0\n"
                f"target_modules = {','.join(TARGETS)}\n")
    r = bu.ctrl_train(args.ctrl, args.plugins, ini, bu.thread_env(args.threads))
    return r, bu.metrics(out)


def ctrl_run(args, work, model, data):
    one, _ = ctrl_once(args, work, model, data, 1)
    many, rows = ctrl_once(args, work, model, data, 1 + args.steps)
    n = args.steps
    return {"step_s": (many.wall_s - one.wall_s) / n, "cpu_s": (many.user_s + many.sys_s - one.user_s - one.sys_s) / n,
            "logged_step_s": bu.mean_of(rows[1:])("step_time"), "rss_mib": many.rss_mib,
            "reward": rows[-1]["reward"]}


def trl_child(args):
    import torch
    from datasets import load_dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(args.threads)
    work = args.trl_child
    tok = bu.tokenizer_with_pad(bu.TINY_TOKENIZER)
    ds = load_dataset("json", data_files=os.path.join(work, "data", "train_prompts.jsonl"), split="train")
    cfg = GRPOConfig(**bu.trl_args(output_dir=os.path.join(work, "trl-out"), per_device_train_batch_size=BATCH,
                                   num_generations=GENS, max_completion_length=args.max_completion_length,
                                   temperature=1.0, learning_rate=1e-3, lr_scheduler_type="constant",
                                   max_steps=1 + args.steps, logging_steps=1, seed=42, beta=0.0))
    m = AutoModelForCausalLM.from_pretrained(os.path.join(work, "lora-model"), dtype=torch.float32)
    peft_cfg = LoraConfig(r=R, lora_alpha=ALPHA, lora_dropout=0.0, target_modules=TARGETS, task_type="CAUSAL_LM")
    tr = GRPOTrainer(model=m, reward_funcs=[bu.reward_len], args=cfg, train_dataset=ds, processing_class=tok,
                     peft_config=peft_cfg)
    walls, cpus = [], []

    from transformers import TrainerCallback

    class Clock(TrainerCallback):
        def on_step_begin(self, a, s, c, **k):
            walls.append(time.perf_counter()), cpus.append(time.process_time())

        def on_step_end(self, a, s, c, **k):
            walls[-1], cpus[-1] = time.perf_counter() - walls[-1], time.process_time() - cpus[-1]

    tr.add_callback(Clock())
    tr.train()
    pm = tr.model
    reps, t0, c0 = 5, time.perf_counter(), time.process_time()
    for _ in range(reps):  # what TRL does each step with vLLM (vllm_generation._iter_named_params)
        pm.merge_adapter()
        n = sum(p.data.numel() for name, p in pm.named_parameters() if pm.prefix not in name)
        pm.unmerge_adapter()
    sync_s, sync_cpu = (time.perf_counter() - t0) / reps, (time.process_time() - c0) / reps
    logs = [h for h in tr.state.log_history if "reward" in h]
    print(json.dumps({"step_s": sum(walls[1:]) / len(walls[1:]), "cpu_s": sum(cpus[1:]) / len(cpus[1:]),
                      "sync_s": sync_s, "sync_cpu_s": sync_cpu, "synced_floats": n, "reward": logs[-1]["reward"]}))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-completion-length", type=int, default=32)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    ap.add_argument("--ctrl", default=os.path.join(bu.ROOT, "build/ctrl"))
    ap.add_argument("--plugins", default=os.path.join(bu.ROOT, "build/plugins"))
    ap.add_argument("--trl-child")
    args = ap.parse_args()
    if args.trl_child:
        return trl_child(args)
    work, _, data = bu.quickstart_model(args, "ctrl-bench-lora-grpo-")
    model = os.path.join(work, "lora-model")  # the bench's shape (the quickstart's model is smaller)
    bu.model_init(args.ctrl, args.plugins, model, SHAPES[args.shape], bu.TINY_TOKENIZER, seed=1)
    load = bu.load_average()
    c = ctrl_run(args, work, model, data)
    t, tr = bu.child_json(bu.child_cmd(__file__, "--trl-child", work, args,
                                       ["steps", "threads", "max_completion_length", "shape"]),
                          env=bu.thread_env(args.threads))
    t["rss_mib"] = tr.rss_mib
    print(f"LoRA-GRPO step ({args.shape} model), {args.steps} steps after a warm-up, {BATCH} completions x <= "
          f"{args.max_completion_length} tokens, {args.threads} threads; {bu.machine()}; load {load} -> "
          f"{bu.load_average()}")
    bu.print_ratio_table(c, t, [("step_s", "step wall (s)"), ("cpu_s", "step CPU (s)"), ("rss_mib", "peak RSS (MiB)")],
                         18)
    print(f"TRL's per-step vLLM sync (merge + read + unmerge), not incurred without vLLM: {t['sync_s']:.4f} s wall, "
          f"{t['sync_cpu_s']:.4f} s CPU, {t['synced_floats']} floats; ctrl: none (adapters applied live)")
    print(json.dumps({"ctrl": c, "trl": t}))


if __name__ == "__main__":
    sys.exit(main())
