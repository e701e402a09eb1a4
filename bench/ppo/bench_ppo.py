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
optimizer), and the peak RSS of each trainer's process (ctrl's own, by wait4; TRL's its own
Python process, which holds nothing else).

usage: /work/venv-ppo/bin/python bench/ppo/bench_ppo.py [--tokenizer tiny|qwen3] [--steps N]
       [--batch N] [--response-length N] [--threads N]
(after scripts/build.sh; the Python needs trl==0.25.1, transformers 4.57, torch: see
tests/reference/make_ppo_fixtures.py for the environment)"""
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
import bench_util as bu  # noqa: E402

TOKENIZERS = {"tiny": bu.TINY_TOKENIZER, "qwen3": bu.qwen3_tokenizer()}
CTRL, PLUGINS = bu.build_paths("CTRL_BUILD")  # the build folder to bench
LR, KL_COEF, VF_COEF = 1e-4, 0.05, 0.1
POLICY = bu.model_shape(128, 2, 4, 2, 512)


def make_prompts(path, n=256, seed=0):
    rng = random.Random(seed)
    with open(path, "w") as f:
        for _ in range(n):
            a, b = rng.randrange(1000), rng.randrange(1000)
            f.write(json.dumps({"prompt": bu.arith_prompt(rng, a, b, 12)}) + "\n")


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
    bu.write_ini(ini, {"run": bu.cpu_run(f"{d}/ctrl_out", trainer="ppo", seed=42),
                       "model": {"path": f"{d}/policy", "attention": "flash"},
                       "data": {"train_file": f"{d}/prompts.jsonl", "shuffle": "false"},
                       "train": bu.train_section(LR, args.steps, args.batch, 1, lr_scheduler_type="constant",
                                                 gradient_accumulation_steps=1, max_grad_norm=0),
                       "generation": {"kv_cache_bytes": 64000000, "temperature": 1.0},
                       "ppo": {"response_length": args.response_length, "stop_token": "eos", "num_ppo_epochs": 1,
                               "num_mini_batches": 1, "kl_coef": KL_COEF, "vf_coef": VF_COEF, "value_model": f"{d}/rm"},
                       "reward.rm": {"plugin": "reward_model", "path": f"{d}/rm"}})
    run = bu.ctrl_train(CTRL, PLUGINS, ini, bu.thread_env(args.threads, OMP_WAIT_POLICY="PASSIVE"))
    rows = bu.metrics(f"{d}/ctrl_out")[1:]  # warm-up
    mean = bu.mean_of(rows)
    step, gen, rew = mean("step_time"), mean("timing/generation_s"), mean("timing/reward_s")
    return {"generation": gen, "reward": rew, "rest": step - gen - rew, "step": step, "rss_mib": run.rss_mib,
            "scores": rows[-1]["objective/scores"], "wall": run.wall_s}


def trl_child(d, args):
    os.environ["TRL_EXPERIMENTAL_SILENCE"] = "1"
    import torch
    import trl
    import trl.trainer.ppo_trainer as ppo_mod
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, TrainerCallback
    from trl import PPOConfig, PPOTrainer

    torch.set_num_threads(args.threads)
    tok = bu.tokenizer_with_pad(os.path.join(d, "policy"), padding_side="left")
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
                        lr_scheduler_type="constant", num_sample_generations=0, logging_steps=1, seed=42,
                        **bu.trl_args())
        tr = PPOTrainer(args=cfg, processing_class=tok, model=policy, ref_model=ref, reward_model=reward,
                        train_dataset=ds, value_model=value, eval_dataset=ds.select(range(8)))
        tr.add_callback(Clock())
        tr.train()
        logs = [h for h in tr.state.log_history if "objective/scores" in h]
    rss = bu.peak_rss_self()
    n = len(steps) - 2
    step = (steps[-1] - steps[1]) / n
    gen, rew = timing["generation"] / n, timing["reward"] / n
    print(json.dumps({"generation": gen, "reward": rew, "rest": step - gen - rew, "step": step, "rss_mib": rss,
                      "scores": logs[-1]["objective/scores"],
                      "versions": f"trl {trl.__version__}, torch {torch.__version__}"}))


def run_trl(d, args):
    env = bu.thread_env(args.threads, OMP_WAIT_POLICY="PASSIVE")  # as ctrl's run
    return bu.child_json(bu.child_cmd(__file__, "--trl-child", d, args, ("threads", "steps", "batch",
                                                                         "response_length")), env=env)[0]


def main():
    def options(p):
        p.add_argument("--tokenizer", choices=sorted(TOKENIZERS), default="tiny")
        p.add_argument("--response-length", type=int, default=32)

    args = bu.parse_bench_args(6, 8, options)
    if args.trl_child:
        return trl_child(args.trl_child, args)
    print(f"machine: {bu.machine()}; load average {os.getloadavg()}; threads {args.threads}, "
          f"tokenizer {args.tokenizer}, {args.batch} prompts x 1 completion of <= {args.response_length} tokens, "
          f"{args.steps} updates (the first not counted), fp32", flush=True)
    with tempfile.TemporaryDirectory() as d:
        make_prompts(os.path.join(d, "prompts.jsonl"))
        bu.model_init(CTRL, PLUGINS, os.path.join(d, "policy"), POLICY, TOKENIZERS[args.tokenizer], seed=1)
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
