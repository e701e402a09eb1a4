#!/usr/bin/env python3
"""PPO on the CPU, ctrl against trl 0.25.1's PPOTrainer (the last TRL that shipped it; TRL 1.x dropped
it), in one run: the same random-init Qwen2-shaped policy (made by `ctrl model init` with the given
tokenizer), the same one-label reward model, which is also the value model's initial weights (a
Qwen2ForSequenceClassification over the policy's trunk with a seeded random score head, saved by
transformers), the same prompts (additions with filler words), fp32, the same batch, response length,
learning rate and threads. One update per optimizer step on both sides (num_ppo_epochs 1,
num_mini_batches 1, gradient_accumulation_steps 1): each step generates one completion per prompt
(response_length new tokens at temperature 1, the EOS as stop token), scores it with the reward
model, reads the reference and value models and trains the policy and the value model.
Reported per step (mean over the steps after the first, a warm-up): the generation, the reward
model's scores, the rest (reference and value forwards, GAE, the policy and value passes and the
optimizer), and the peak RSS of each trainer's process (ctrl's by /usr/bin/time; TRL's its own
Python process, which holds nothing else).

usage: /work/venv-ppo/bin/python bench/ppo/bench_ppo.py [--tokenizer tiny|qwen3] [--steps N]
       [--batch N] [--response-length N] [--threads N]
(after scripts/build.sh; the Python needs trl==0.25.1, transformers 4.57, torch: see
tests/reference/make_ppo_fixtures.py for the environment)"""
import argparse
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TOKENIZERS = {"tiny": os.path.join(ROOT, "tests", "fixtures", "tokenizer", "tiny_bpe"),
              "qwen3": os.path.abspath(os.path.join(ROOT, "..", "shared", "data", "tokenizers", "qwen3"))}
if not os.path.isdir(TOKENIZERS["qwen3"]):
    TOKENIZERS["qwen3"] = "/work/shared/data/tokenizers/qwen3"
BUILD = os.environ.get("CTRL_BUILD", os.path.join(ROOT, "build"))  # the build folder to bench
CTRL = os.path.join(BUILD, "ctrl")
PLUGINS = os.path.join(BUILD, "plugins")
LR, KL_COEF, VF_COEF = 1e-4, 0.05, 0.1
POLICY = ["--hidden", "128", "--layers", "2", "--heads", "4", "--kv-heads", "2", "--intermediate", "512"]


def make_prompts(path, n=256, seed=0):
    rng = random.Random(seed)
    words = "alpha beta gamma delta tensor kernel gradient batch token model layer cache vector matrix".split()
    with open(path, "w") as f:
        for _ in range(n):
            a, b = rng.randrange(1000), rng.randrange(1000)
            f.write(json.dumps({"prompt": f"Question: what is {a} + {b}? " + " ".join(rng.choices(words, k=12)) +
                                "\nAnswer:"}) + "\n")


def make_reward_model(d):
    """The policy's trunk under a one-label score head (seeded), as transformers saves a classifier."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    torch.manual_seed(7)
    tok = AutoTokenizer.from_pretrained(os.path.join(d, "policy"))
    m = AutoModelForSequenceClassification.from_pretrained(os.path.join(d, "policy"), num_labels=1,
                                                           dtype=torch.float32)
    m.config.pad_token_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    with torch.no_grad():
        m.score.weight.normal_(0, 0.5)
    m.save_pretrained(os.path.join(d, "rm"), safe_serialization=True)
    for f in os.listdir(os.path.join(d, "policy")):
        if f.startswith("tokenizer") or f.endswith(".jinja"):
            shutil.copy(os.path.join(d, "policy", f), os.path.join(d, "rm", f))


def run_ctrl(d, args):
    ini = os.path.join(d, "ctrl.ini")
    with open(ini, "w") as f:
        f.write(f"""[run]
trainer = ppo
output_dir = {d}/ctrl_out
seed = 42
device = cpu
[model]
path = {d}/policy
attention = flash
[data]
train_file = {d}/prompts.jsonl
shuffle = false
[train]
dtype = fp32
learning_rate = {LR}
lr_scheduler_type = constant
max_steps = {args.steps}
per_device_train_batch_size = {args.batch}
gradient_accumulation_steps = 1
max_grad_norm = 0
logging_steps = 1
save_strategy = no
[generation]
kv_cache_bytes = 64000000
temperature = 1.0
[ppo]
response_length = {args.response_length}
stop_token = eos
num_ppo_epochs = 1
num_mini_batches = 1
kl_coef = {KL_COEF}
vf_coef = {VF_COEF}
value_model = {d}/rm
[reward.rm]
plugin = reward_model
path = {d}/rm
""")
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), OMP_WAIT_POLICY="PASSIVE")
    t0 = time.perf_counter()
    out = subprocess.run(["/usr/bin/time", "-f", "%M", CTRL, "--plugin-dir", PLUGINS, "train", ini], env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - t0
    if out.returncode != 0:
        sys.exit(f"ctrl train failed:\n{out.stderr[-3000:]}")
    rss = int(out.stderr.strip().splitlines()[-1]) / 1024
    rows = [json.loads(l) for l in open(f"{d}/ctrl_out/metrics.jsonl") if '"loss"' in l][1:]  # warm-up
    n = len(rows)
    mean = lambda k: sum(r.get(k) or 0 for r in rows) / n  # noqa: E731
    step, gen, rew = mean("step_time"), mean("timing/generation_s"), mean("timing/reward_s")
    return {"generation": gen, "reward": rew, "rest": step - gen - rew, "step": step, "rss_mib": rss,
            "scores": rows[-1]["objective/scores"], "wall": wall}


def trl_child(d, args):
    os.environ["TRL_EXPERIMENTAL_SILENCE"] = "1"
    import torch
    import trl
    import trl.trainer.ppo_trainer as ppo_mod
    from datasets import Dataset
    from transformers import (AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer,
                              TrainerCallback)
    from trl import PPOConfig, PPOTrainer

    torch.set_num_threads(args.threads)
    tok = AutoTokenizer.from_pretrained(os.path.join(d, "policy"), padding_side="left")
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    prompts = [json.loads(l)["prompt"] for l in open(os.path.join(d, "prompts.jsonl"))]
    ds = Dataset.from_list([{"input_ids": tok(p)["input_ids"]} for p in prompts])
    policy = AutoModelForCausalLM.from_pretrained(os.path.join(d, "policy"), dtype=torch.float32)
    ref = AutoModelForCausalLM.from_pretrained(os.path.join(d, "policy"), dtype=torch.float32)
    value = AutoModelForSequenceClassification.from_pretrained(os.path.join(d, "rm"), num_labels=1,
                                                               dtype=torch.float32)
    reward = AutoModelForSequenceClassification.from_pretrained(os.path.join(d, "rm"), num_labels=1,
                                                                dtype=torch.float32)
    timing = {"generation": 0.0, "reward": 0.0}
    gen_fn, rew_fn = ppo_mod.batch_generation, ppo_mod.get_reward

    def timed_generation(*a, **k):
        t0 = time.perf_counter()
        out = gen_fn(*a, **k)
        timing["generation"] += time.perf_counter() - t0
        return out

    def timed_reward(model, *a, **k):
        t0 = time.perf_counter()
        out = rew_fn(model, *a, **k)
        if model is reward:
            timing["reward"] += time.perf_counter() - t0
        return out
    ppo_mod.batch_generation, ppo_mod.get_reward = timed_generation, timed_reward
    steps = []

    class Clock(TrainerCallback):
        def on_train_begin(self, *a, **k):
            steps.append(time.perf_counter())

        def on_step_end(self, *a, **k):
            now = time.perf_counter()
            if len(steps) == 1:  # the first update is a warm-up
                timing.update({key: 0.0 for key in timing})
            steps.append(now)

    with tempfile.TemporaryDirectory() as tmp:
        cfg = PPOConfig(output_dir=tmp, per_device_train_batch_size=args.batch, gradient_accumulation_steps=1,
                        num_mini_batches=1, num_ppo_epochs=1, total_episodes=args.steps * args.batch,
                        local_rollout_forward_batch_size=args.batch, response_length=args.response_length,
                        temperature=1.0, stop_token="eos", kl_coef=KL_COEF, vf_coef=VF_COEF, learning_rate=LR,
                        lr_scheduler_type="constant", num_sample_generations=0, report_to=[], use_cpu=True,
                        bf16=False, logging_steps=1, save_strategy="no", seed=42, dataloader_num_workers=0)
        tr = PPOTrainer(args=cfg, processing_class=tok, model=policy, ref_model=ref, reward_model=reward,
                        train_dataset=ds, value_model=value, eval_dataset=ds.select(range(8)))
        tr.add_callback(Clock())
        tr.train()
        logs = [h for h in tr.state.log_history if "objective/scores" in h]
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    n = len(steps) - 2
    step = (steps[-1] - steps[1]) / n
    gen, rew = timing["generation"] / n, timing["reward"] / n
    print(json.dumps({"generation": gen, "reward": rew, "rest": step - gen - rew, "step": step, "rss_mib": rss,
                      "scores": logs[-1]["objective/scores"],
                      "versions": f"trl {trl.__version__}, torch {torch.__version__}"}))


def run_trl(d, args):
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), OMP_WAIT_POLICY="PASSIVE")  # as ctrl's run
    out = subprocess.run([sys.executable, __file__, "--trl-child", d, "--threads", str(args.threads), "--steps",
                          str(args.steps), "--batch", str(args.batch), "--response-length",
                          str(args.response_length)], capture_output=True, text=True, env=env)
    if out.returncode != 0:
        sys.exit(f"TRL failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--tokenizer", choices=sorted(TOKENIZERS), default="tiny")
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--response-length", type=int, default=32)
    p.add_argument("--trl-child")
    args = p.parse_args()
    if args.trl_child:
        return trl_child(args.trl_child, args)
    cpu = open("/proc/cpuinfo").read().split("model name")[1].split("\n")[0].split(":", 1)[1].strip()
    print(f"machine: {os.cpu_count()} cores, {cpu}; load average {os.getloadavg()}; threads {args.threads}, "
          f"tokenizer {args.tokenizer}, {args.batch} prompts x 1 completion of <= {args.response_length} tokens, "
          f"{args.steps} updates (the first not counted), fp32", flush=True)
    with tempfile.TemporaryDirectory() as d:
        make_prompts(os.path.join(d, "prompts.jsonl"))
        subprocess.run([CTRL, "--plugin-dir", PLUGINS, "model", "init", "--arch", "qwen2", *POLICY, "--seed", "1",
                        "--tokenizer", TOKENIZERS[args.tokenizer], "--out", os.path.join(d, "policy")], check=True,
                       stdout=subprocess.DEVNULL)
        rm = subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {os.path.dirname(__file__)!r}); "
                             f"import bench_ppo; bench_ppo.make_reward_model({d!r})"], capture_output=True, text=True)
        if rm.returncode != 0:
            sys.exit(f"reward model: {rm.stderr[-2000:]}")
        c = run_ctrl(d, args)
        t = run_trl(d, args)
        print(f"TRL: {t['versions']}")
        print("per update (s):  generation  reward   rest    step   peak RSS  last objective/scores")
        for name, r in (("ctrl", c), ("TRL", t)):
            print(f"  {name:4}  {r['generation']:10.3f} {r['reward']:8.3f} {r['rest']:7.3f} {r['step']:7.3f} "
                  f"{r['rss_mib']:6.0f} MiB  {r['scores']:.4f}")
        print(f"  ratio: TRL's step / ctrl's {t['step'] / c['step']:.2f}x (generation "
              f"{t['generation'] / c['generation']:.2f}x, reward {t['reward'] / max(c['reward'], 1e-9):.2f}x, rest "
              f"{t['rest'] / c['rest']:.2f}x); peak RSS ctrl / TRL {c['rss_mib'] / t['rss_mib']:.2f}x")
        print(json.dumps({"ctrl": c, "trl": t, "load": os.getloadavg()}))


if __name__ == "__main__":
    sys.exit(main())
