"""What the ctrl-against-TRL benchmarks share (bench/*/bench_*.py import it): the checkout's paths,
the machine line, `ctrl model init`, running a child process to its end with its own peak RSS and
CPU time, ctrl's metrics.jsonl, the TRL child's command line and JSON answer, and the TRL-side
helpers (tokenizer, sequential sampler, timed methods, the step clock, the logged values).

A bench finds it with
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
    import bench_util as bu
Only the standard library is imported at module level; torch / transformers / trl are imported by
the helpers that need them (inside the TRL child), so the ctrl side runs on any Python 3.9+."""
import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import types

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TINY_TOKENIZER = os.path.join(ROOT, "tests", "fixtures", "tokenizer", "tiny_bpe")
# filler words of the synthetic rows (arithmetic prompts with some noise around them)
WORDS = "alpha beta gamma delta tensor kernel gradient batch token model layer cache vector matrix".split()


def arith_prompt(rng, a, b, k):
    """The synthetic rows' prompt: an addition, k filler words drawn by rng, and 'Answer:'."""
    return f"Question: what is {a} + {b}? " + " ".join(rng.choices(WORDS, k=k)) + "\nAnswer:"


def filler(rng, k):
    """k filler words drawn by rng, joined by spaces."""
    return " ".join(rng.choices(WORDS, k=k))


def qwen3_tokenizer():
    """Qwen3's tokenizer folder: shared/data/tokenizers/qwen3 beside the checkout (/work/main) or its
    worktree (/work/wt/NAME), else /work/shared's."""
    for up in (("..",), ("..", "..")):
        path = os.path.abspath(os.path.join(ROOT, *up, "shared", "data", "tokenizers", "qwen3"))
        if os.path.isdir(path):
            return path
    return "/work/shared/data/tokenizers/qwen3"


def build_paths(env_var):
    """(ctrl binary, plugin folder) of the build folder named by $env_var, else ROOT/build."""
    build = os.environ.get(env_var, os.path.join(ROOT, "build"))
    return os.path.join(build, "ctrl"), os.path.join(build, "plugins")


def cpu_model():
    """The CPU's model name from /proc/cpuinfo."""
    return open("/proc/cpuinfo").read().split("model name")[1].split("\n")[0].split(":", 1)[1].strip()


def machine():
    """'N cores, MODEL': the start of the benches' machine line."""
    return f"{os.cpu_count()} cores, {cpu_model()}"


def load_average():
    """The 1, 5 and 15 minute load averages, as /proc/loadavg writes them."""
    return " ".join(open("/proc/loadavg").read().split()[:3])


def thread_env(threads, **extra):
    """This process's environment with OMP_NUM_THREADS = threads and the extra variables."""
    return dict(os.environ, OMP_NUM_THREADS=str(threads), **extra)


def model_shape(hidden, layers, heads, kv_heads, intermediate=None, tie=False):
    """`ctrl model init` flags of a model's shape."""
    flags = ["--hidden", str(hidden), "--layers", str(layers), "--heads", str(heads), "--kv-heads", str(kv_heads)]
    if intermediate is not None:
        flags += ["--intermediate", str(intermediate)]
    return flags + (["--tie-embeddings"] if tie else [])


def model_init(ctrl, plugins, out, shape, tokenizer, arch=("--arch", "qwen2"), seed=None, env=None):
    """`ctrl model init`: a random-initialized model of the given shape flags (model_shape) and
    tokenizer folder in out; arch: the flags naming the architecture (and its experts)."""
    cmd = [ctrl, "--plugin-dir", plugins, "model", "init", *arch, *shape]
    if seed is not None:
        cmd += ["--seed", str(seed)]
    subprocess.run(cmd + ["--tokenizer", tokenizer, "--out", out], check=True, stdout=subprocess.DEVNULL, env=env)


def quickstart_model(args, prefix):
    """A new work folder (prefix...) holding the quickstart's data (scripts/make_quickstart_data.sh) in
    data/ and the online benches' tiny random Qwen2 (hidden 128, 2 layers, 4 heads, 2 KV heads, the
    tiny tokenizer) in model/, made with args.ctrl and args.plugins: (work, model, data)."""
    work = tempfile.mkdtemp(prefix=prefix)
    data, model = os.path.join(work, "data"), os.path.join(work, "model")
    subprocess.run(["bash", os.path.join(ROOT, "scripts", "make_quickstart_data.sh"), data], check=True,
                   stdout=subprocess.DEVNULL)
    model_init(args.ctrl, args.plugins, model, model_shape(128, 2, 4, 2), TINY_TOKENIZER)
    return work, model, data


def write_text(path, text):
    with open(path, "w") as f:
        f.write(text)
    return path


def write_ini(path, sections):
    """Writes ctrl's config: sections is {section: {key: value}}, each value as str() writes it."""
    return write_text(path, "".join(f"[{name}]\n" + "".join(f"{k} = {v}\n" for k, v in keys.items())
                                    for name, keys in sections.items()))


def train_section(learning_rate, steps, batch, logging_steps, dtype="fp32", save_strategy="no", **more):
    """The benches' [train]: fp32 and no checkpoints saved unless said (save_strategy None: ctrl's
    default), and the more keys."""
    keys = dict(dtype=dtype, learning_rate=learning_rate, max_steps=steps, per_device_train_batch_size=batch,
                logging_steps=logging_steps, save_strategy=save_strategy, **more)
    return {k: v for k, v in keys.items() if v is not None}


def cpu_run(output_dir, **more):
    """The benches' [run] on the CPU: the more keys (trainer, seed) first."""
    return dict(more, output_dir=output_dir, device="cpu")


def quickstart_online_ini(path, trainer, out, model, data, steps, batch, trainer_keys):
    """The config of an online bench on the quickstart's prompts (quickstart_model): a constant learning
    rate of 1e-3, temperature 1, the length reward with target 20 (bu.reward_len on TRL's side) and
    trainer's own section."""
    return write_ini(path, {"run": cpu_run(out, trainer=trainer, seed=42), "model": {"path": model},
                            "data": {"train_file": f"{data}/train_prompts.jsonl"},
                            "train": train_section(1e-3, steps, batch, 1, lr_scheduler_type="constant"),
                            "generation": {"kv_cache_bytes": 256000000, "temperature": 1.0},
                            trainer: trainer_keys, "reward.len": {"plugin": "length", "target_length": 20}})


def read_jsonl(path):
    return [json.loads(line) for line in open(path)]


def run_child(cmd, env=None, what=None):
    """Runs cmd to its end as this process's child (its output kept in files, so that no pipe fills)
    and waits for it with wait4. Returns .rss_mib (the child's own peak RSS), .user_s (its user CPU
    seconds), .sys_s (its system CPU seconds), .wall_s, .stdout and .stderr. A child that fails ends the bench with its stderr's tail."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        t0 = time.perf_counter()
        p = subprocess.Popen(cmd, env=env, stdout=out, stderr=err, text=True)
        _, status, ru = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t0
        p.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        r = types.SimpleNamespace(rss_mib=ru.ru_maxrss / 1024, user_s=ru.ru_utime, sys_s=ru.ru_stime, wall_s=wall,
                                  stdout=out.read(), stderr=err.read())
    if p.returncode != 0:
        sys.exit(f"{what or cmd[0]} failed (exit {p.returncode}):\n{r.stderr[-3000:]}")
    return r


def ctrl_train(ctrl, plugins, ini, env, prefix=()):
    """`ctrl train ini` as a measured child (run_child); prefix: a wrapper command (perf record ...)."""
    return run_child([*prefix, ctrl, "--plugin-dir", plugins, "train", ini], env=env, what="ctrl train")


def metrics(out_dir, key='"loss"'):
    """The rows of out_dir/metrics.jsonl whose text holds key (the training steps' rows by default)."""
    return [json.loads(line) for line in open(os.path.join(out_dir, "metrics.jsonl")) if key in line]


def mean_of(rows):
    """A function of a metric's name: its mean over rows (a missing or null value counts as 0)."""
    return lambda k: sum(r.get(k) or 0 for r in rows) / len(rows)


def parse_bench_args(steps, batch, add=None):
    """The command line of a bench that runs TRL in a child of itself: --threads (default: every core),
    --steps, --batch, the bench's own options (add(parser)), and --trl-child FOLDER (the child's)."""
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--steps", type=int, default=steps)
    p.add_argument("--batch", type=int, default=batch)
    if add:
        add(p)
    p.add_argument("--trl-child")
    return p.parse_args()


def child_cmd(script, flag, folder, args, names, *extra):
    """This Python running script again as a child: `script flag folder --name value ... extra`, the
    values of names read from args (an argparse namespace; name_x is passed as --name-x)."""
    cmd = [sys.executable, os.path.abspath(script), flag, folder, *extra]
    for k in names:
        cmd += [f"--{k.replace('_', '-')}", str(getattr(args, k))]
    return cmd


def child_json(cmd, env=None, what="TRL"):
    """Runs a child bench (run_child) that prints its results as JSON on its last line: (the results,
    the run)."""
    r = run_child(cmd, env=env, what=what)
    return json.loads(r.stdout.strip().splitlines()[-1]), r


def print_ratio_table(c, t, rows, width, ratio_head="ratio", ratio_spec="8.1f", suffix="x"):
    """A table of ctrl's and TRL's values and TRL / ctrl: rows are (key, label)."""
    print(f"{'':{width}}{'ctrl':>10}{'TRL':>10}{ratio_head:>{len(format(0.0, ratio_spec))}}")
    for k, label in rows:
        print(f"{label:{width}}{c[k]:10.4f}{t[k]:10.4f}{t[k] / max(c[k], 1e-9):{ratio_spec}}{suffix}")


# --- the TRL side (inside the TRL child or process: torch, transformers and trl are importable) ---


def peak_rss_self():
    """This process's peak RSS in MiB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def torch_version():
    import torch

    return f"torch {torch.__version__}"


def tokenizer_with_pad(path, **kw):
    """AutoTokenizer.from_pretrained(path, **kw), its EOS as the pad token where it has none."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path, **kw)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def reward_len(completions, **kw):
    """TRL's reward_len example with target 20 (ctrl's `length` reward plugin, target_length 20)."""
    return [-abs(20 - len(c)) for c in completions]


def sequential(trainer_cls):
    """trainer_cls taking the rows in order (as ctrl does with [data] shuffle = false)."""
    from torch.utils.data import SequentialSampler

    class Sequential(trainer_cls):
        def _get_train_sampler(self, *a, **k):
            return SequentialSampler(self.train_dataset)

    return Sequential


def trl_args(**kw):
    """The TrainingArguments every bench gives TRL (CPU, fp32, no reports, no saves, no loader workers),
    with kw added or overriding them."""
    return dict(dict(report_to=[], use_cpu=True, bf16=False, save_strategy="no", dataloader_num_workers=0), **kw)


def train_timed(trainer):
    """trainer.train(): (its wall seconds, this process's CPU seconds during it)."""
    t0, c0 = time.perf_counter(), time.process_time()
    trainer.train()
    return time.perf_counter() - t0, time.process_time() - c0


def last_logged(trainer, key):
    """The last value of key in the trainer's log history."""
    return [h[key] for h in trainer.state.log_history if key in h][-1]


def timed(obj, name, times, key):
    """Wraps obj.name so that its calls' time adds to times[key]."""
    f = getattr(obj, name)

    def wrapper(*a, **k):
        t = time.perf_counter()
        r = f(*a, **k)
        times[key] += time.perf_counter() - t
        return r

    setattr(obj, name, wrapper)


def step_clock(times, steps):
    """A TrainerCallback that appends each optimizer step's seconds to steps and zeroes times when the
    second step begins (the first is a warm-up)."""
    from transformers import TrainerCallback

    class Clock(TrainerCallback):
        def on_step_begin(self, a, s, c, **k):
            steps.append(time.perf_counter())
            if len(steps) == 2:
                times.update({key: 0.0 for key in times})

        def on_step_end(self, a, s, c, **k):
            steps[-1] = time.perf_counter() - steps[-1]

    return Clock()
