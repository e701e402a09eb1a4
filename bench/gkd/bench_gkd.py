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
import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TINY = os.path.join(ROOT, "tests", "fixtures", "tokenizer", "tiny_bpe")
BUILD = os.environ.get("CTRL_BUILD", os.path.join(ROOT, "build"))  # the build folder to bench
CTRL = os.path.join(BUILD, "ctrl")
PLUGINS = os.path.join(BUILD, "plugins")
LR, BETA, TEMPERATURE = 1e-4, 0.5, 0.9
STUDENT = ["--hidden", "128", "--layers", "2", "--heads", "4", "--kv-heads", "2", "--intermediate", "512"]
TEACHER = ["--hidden", "256", "--layers", "6", "--heads", "4", "--kv-heads", "2", "--intermediate", "1024"]


def make_rows(path, n=400, seed=0):
    rng = random.Random(seed)
    words = "alpha beta gamma delta tensor kernel gradient batch token model layer cache vector matrix".split()
    with open(path, "w") as f:
        for _ in range(n):
            a, b = rng.randrange(1000), rng.randrange(1000)
            prompt = f"Question: what is {a} + {b}? " + " ".join(rng.choices(words, k=16)) + "\nAnswer:"
            f.write(json.dumps({"prompt": prompt, "completion": f" {a + b}. " + " ".join(rng.choices(words, k=6))})
                    + "\n")


def run_ctrl(d, args):
    ini = os.path.join(d, "ctrl.ini")
    with open(ini, "w") as f:
        f.write(f"""[run]
trainer = gkd
output_dir = {d}/ctrl_out
device = cpu
[model]
path = {d}/student
attention = flash
[teacher]
path = {d}/teacher
[data]
train_file = {d}/rows.jsonl
shuffle = false
[train]
dtype = fp32
learning_rate = {LR}
max_steps = {args.steps}
per_device_train_batch_size = {args.batch}
logging_steps = {args.steps}
save_strategy = no
[gkd]
lmbda = 1.0
beta = {BETA}
temperature = {TEMPERATURE}
max_new_tokens = {args.new_tokens}
""")
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), OPENBLAS_NUM_THREADS="1")
    t0 = time.perf_counter()
    out = subprocess.run(["/usr/bin/time", "-f", "%M", CTRL, "--plugin-dir", PLUGINS, "train", ini], env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - t0
    if out.returncode != 0:
        sys.exit(f"ctrl train failed:\n{out.stderr}")
    rss = int(out.stderr.strip().splitlines()[-1]) / 1024
    last = [json.loads(l) for l in open(f"{d}/ctrl_out/metrics.jsonl") if '"loss"' in l][-1]
    gen, teacher, train = last["timing/generation_s"], last["timing/teacher_s"], last["timing/train_s"]
    # the loop's optimizer step (clipping, AdamW) is not inside the kind's timings: the step time is
    # the steps' share of the training time, from tokens / tokens_per_second
    step = last["num_tokens"] / last["tokens_per_second"] / args.steps
    return {"generation": gen, "teacher": teacher, "train": step - gen - teacher, "step": step, "rss_mib": rss,
            "loss": last["loss"], "wall": wall}


def trl_child(d, args):
    import torch
    from datasets import Dataset
    from torch.utils.data import SequentialSampler
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl.experimental.gkd import GKDConfig, GKDTrainer

    torch.set_num_threads(args.threads)
    tok = AutoTokenizer.from_pretrained(TINY)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    timing = {"generation": 0.0, "teacher": 0.0, "step": 0.0}

    class Timed(GKDTrainer):
        def _get_train_sampler(self, *a, **k):
            return SequentialSampler(self.train_dataset)

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
    rows = [json.loads(l) for l in open(os.path.join(d, "rows.jsonl"))]
    with tempfile.TemporaryDirectory() as tmp:
        cfg = GKDConfig(output_dir=tmp, report_to=[], use_cpu=True, bf16=False, max_steps=args.steps,
                        per_device_train_batch_size=args.batch, learning_rate=LR, logging_steps=args.steps,
                        save_strategy="no", lmbda=1.0, beta=BETA, temperature=TEMPERATURE,
                        max_new_tokens=args.new_tokens, dataloader_num_workers=0)
        trainer = Timed(model=student, teacher_model=teacher, args=cfg, train_dataset=Dataset.from_list(rows),
                        processing_class=tok, data_collator=collate)
        trainer.train()
        loss = [h["loss"] for h in trainer.state.log_history if "loss" in h][-1]
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    n = args.steps
    print(json.dumps({"generation": timing["generation"] / n, "teacher": timing["teacher"] / n,
                      "train": (timing["step"] - timing["generation"] - timing["teacher"]) / n,
                      "step": timing["step"] / n, "rss_mib": rss, "loss": loss,
                      "versions": f"torch {torch.__version__}"}))


def run_trl(d, args):
    out = subprocess.run([sys.executable, __file__, "--trl-child", d, "--threads", str(args.threads), "--steps",
                          str(args.steps), "--batch", str(args.batch), "--new-tokens", str(args.new_tokens)],
                         capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"TRL failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--trl-child")
    args = p.parse_args()
    if args.trl_child:
        return trl_child(args.trl_child, args)
    cpu = open("/proc/cpuinfo").read().split("model name")[1].split("\n")[0].split(":", 1)[1].strip()
    print(f"machine: {os.cpu_count()} cores, {cpu}; threads {args.threads}, batch {args.batch}, {args.steps} "
          f"steps, lmbda 1, {args.new_tokens} new tokens, fp32", flush=True)
    with tempfile.TemporaryDirectory() as d:
        make_rows(os.path.join(d, "rows.jsonl"))
        for name, shape in (("student", STUDENT), ("teacher", TEACHER)):
            subprocess.run([CTRL, "--plugin-dir", PLUGINS, "model", "init", "--arch", "qwen2", *shape, "--seed",
                            "1" if name == "student" else "2", "--tokenizer", TINY, "--out", os.path.join(d, name)],
                           check=True, stdout=subprocess.DEVNULL)
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
