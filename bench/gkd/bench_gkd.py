#!/usr/bin/env python3
"""GKD on the CPU, ctrl against TRL's GKDTrainer (trl.experimental.gkd), in one run: the same
random-init Qwen2-shaped student and larger teacher (made by `ctrl model init` with the committed tiny
tokenizer), the same prompt-completion rows (additions with filler words), fp32, fully on-policy
(lmbda = 1: every step's completions are sampled by the student, max_new_tokens each, temperature
0.9) so that both do the same work each step, beta 0.5, the same batch size, steps, learning rate and
threads. Each trainer runs in its own process; reported per optimizer step (mean over the steps, the
first included): the time sampling the completions, the teacher's forward, the rest (the student's
forward, the divergence, backward and the optimizer), and the peak RSS of the process.
usage: bench/gkd/bench_gkd.py [--threads N] [--steps N] [--batch N] [--new-tokens N]
(after scripts/build.sh; needs torch, transformers, trl)"""
import json
import os
import random
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
import bench_util as bu  # noqa: E402

CTRL, PLUGINS = bu.build_paths("CTRL_BUILD")  # the build folder to bench
LR, BETA, TEMPERATURE = 1e-4, 0.5, 0.9
STUDENT = bu.model_shape(128, 2, 4, 2, 512)
TEACHER = bu.model_shape(256, 6, 4, 2, 1024)


def make_rows(path, n=400, seed=0):
    rng = random.Random(seed)
    with open(path, "w") as f:
        for _ in range(n):
            a, b = rng.randrange(1000), rng.randrange(1000)
            prompt = bu.arith_prompt(rng, a, b, 16)
            f.write(json.dumps({"prompt": prompt, "completion": f" {a + b}. " + bu.filler(rng, 6)}) + "\n")


def run_ctrl(d, args):
    ini = os.path.join(d, "ctrl.ini")
    bu.write_ini(ini, {"run": bu.cpu_run(f"{d}/ctrl_out", trainer="gkd"),
                       "model": {"path": f"{d}/student", "attention": "flash"}, "teacher": {"path": f"{d}/teacher"},
                       "data": {"train_file": f"{d}/rows.jsonl", "shuffle": "false"},
                       "train": bu.train_section(LR, args.steps, args.batch, args.steps),
                       "gkd": {"lmbda": 1.0, "beta": BETA, "temperature": TEMPERATURE, "max_new_tokens": args.new_tokens}})
    run = bu.ctrl_train(CTRL, PLUGINS, ini, bu.thread_env(args.threads, OPENBLAS_NUM_THREADS="1"))
    last = bu.metrics(f"{d}/ctrl_out")[-1]
    gen, teacher, train = last["timing/generation_s"], last["timing/teacher_s"], last["timing/train_s"]
    # the loop's optimizer step (clipping, AdamW) is not inside the kind's timings: the step time is
    # the steps' share of the training time, from tokens / tokens_per_second
    step = last["num_tokens"] / last["tokens_per_second"] / args.steps
    return {"generation": gen, "teacher": teacher, "train": step - gen - teacher, "step": step,
            "rss_mib": run.rss_mib, "loss": last["loss"], "wall": run.wall_s}


def trl_child(d, args):
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM
    from trl.experimental.gkd import GKDConfig, GKDTrainer

    torch.set_num_threads(args.threads)
    tok = bu.tokenizer_with_pad(bu.TINY_TOKENIZER)
    timing = {"generation": 0.0, "teacher": 0.0, "step": 0.0}

    class Timed(bu.sequential(GKDTrainer)):
        def training_step(self, *a, **k):
            t0 = time.perf_counter()
            out = super().training_step(*a, **k)
            timing["step"] += time.perf_counter() - t0
            return out

        @staticmethod
        def generate_on_policy_outputs(model, inputs, generation_config):
            t0 = time.perf_counter()
            out = GKDTrainer.generate_on_policy_outputs(model, inputs, generation_config)
            timing["generation"] += time.perf_counter() - t0
            return out

    def collate(rows):
        """prompt + completion + EOS, right-padded, labels on the completion; prompts left-padded."""
        seqs, prompts = [], []
        for r in rows:
            p = tok(r["prompt"], add_special_tokens=False)["input_ids"]
            c = tok(r["completion"], add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
            seqs.append((p, c)), prompts.append(p)
        L, P = max(len(p) + len(c) for p, c in seqs), max(len(p) for p in prompts)
        pad = tok.pad_token_id
        ids = [p + c + [pad] * (L - len(p) - len(c)) for p, c in seqs]
        att = [[1] * (len(p) + len(c)) + [0] * (L - len(p) - len(c)) for p, c in seqs]
        lab = [[-100] * len(p) + c + [-100] * (L - len(p) - len(c)) for p, c in seqs]
        return {"input_ids": torch.tensor(ids), "attention_mask": torch.tensor(att), "labels": torch.tensor(lab),
                "prompts": torch.tensor([[pad] * (P - len(p)) + p for p in prompts]),
                "prompt_attention_mask": torch.tensor([[0] * (P - len(p)) + [1] * len(p) for p in prompts])}

    student = AutoModelForCausalLM.from_pretrained(os.path.join(d, "student"), dtype=torch.float32,
                                                   attn_implementation="sdpa")
    teacher = AutoModelForCausalLM.from_pretrained(os.path.join(d, "teacher"), dtype=torch.float32,
                                                   attn_implementation="sdpa")

    def pre(*_):
        timing["t0"] = time.perf_counter()

    def post(*_):
        timing["teacher"] += time.perf_counter() - timing["t0"]

    teacher.register_forward_pre_hook(pre)
    teacher.register_forward_hook(post)
    rows = bu.read_jsonl(os.path.join(d, "rows.jsonl"))
    with tempfile.TemporaryDirectory() as tmp:
        cfg = GKDConfig(**bu.trl_args(output_dir=tmp, max_steps=args.steps, per_device_train_batch_size=args.batch,
                                      learning_rate=LR, logging_steps=args.steps, lmbda=1.0, beta=BETA,
                                      temperature=TEMPERATURE, max_new_tokens=args.new_tokens))
        trainer = Timed(model=student, teacher_model=teacher, args=cfg, train_dataset=Dataset.from_list(rows),
                        processing_class=tok, data_collator=collate)
        trainer.train()
        loss = bu.last_logged(trainer, "loss")
    n = args.steps
    print(json.dumps({"generation": timing["generation"] / n, "teacher": timing["teacher"] / n,
                      "train": (timing["step"] - timing["generation"] - timing["teacher"]) / n,
                      "step": timing["step"] / n, "rss_mib": bu.peak_rss_self(), "loss": loss,
                      "versions": bu.torch_version()}))


def run_trl(d, args):
    return bu.child_json(bu.child_cmd(__file__, "--trl-child", d, args, ("threads", "steps", "batch", "new_tokens")))[0]


def main():
    args = bu.parse_bench_args(10, 8, lambda p: p.add_argument("--new-tokens", type=int, default=32))
    if args.trl_child:
        return trl_child(args.trl_child, args)
    print(f"machine: {bu.machine()}; threads {args.threads}, batch {args.batch}, {args.steps} "
          f"steps, lmbda 1, {args.new_tokens} new tokens, fp32", flush=True)
    with tempfile.TemporaryDirectory() as d:
        make_rows(os.path.join(d, "rows.jsonl"))
        for name, shape, seed in (("student", STUDENT, 1), ("teacher", TEACHER, 2)):
            bu.model_init(CTRL, PLUGINS, os.path.join(d, name), shape, bu.TINY_TOKENIZER, seed=seed)
        c = run_ctrl(d, args)
        t = run_trl(d, args)
        print("per step (s):  generation  teacher   train    step   peak RSS  final loss")
        for name, r in (("ctrl", c), ("TRL", t)):
            print(f"  {name:4}  {r['generation']:10.3f} {r['teacher']:8.3f} {r['train']:7.3f} {r['step']:7.3f} "
                  f"{r['rss_mib']:6.0f} MiB  {r['loss']:.4f}")
        print(f"  ratio: TRL's step / ctrl's {t['step'] / c['step']:.2f}x (generation "
              f"{t['generation'] / c['generation']:.2f}x, teacher {t['teacher'] / c['teacher']:.2f}x, train "
              f"{t['train'] / c['train']:.2f}x), ctrl's peak RSS {c['rss_mib'] / t['rss_mib']:.2f}x TRL's  "
              f"({t['versions']})", flush=True)


if __name__ == "__main__":
    main()
