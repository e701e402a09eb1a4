#!/usr/bin/env python3
"""Interop: TRL's reward_len, a Python function written as a TRL user writes it
(examples/rewards/reward_len.py), served to ctrl by examples/rewards/trl_reward_command.py through
the `command` reward plugin, trains GRPO exactly as the built-in `length` plugin does: the same
seeded run with either reward must log the same metrics, step for step (timings aside), and the
length reward must rise. usage: check_command_reward.py BUILD_DIR (after scripts/build.sh)"""
import json
import os
import subprocess
import sys
import tempfile

from fixture_io import tiny_quickstart

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def run(ctrl, d, name, reward):
    with open(f"{d}/{name}.ini", "w") as f:
        f.write(f"""[run]
trainer = grpo
output_dir = {d}/{name}
seed = 42
device = cpu
[model]
path = {d}/model
[data]
train_file = {d}/data/train_prompts.jsonl
[train]
learning_rate = 1e-3
lr_scheduler_type = constant
max_steps = 12
per_device_train_batch_size = 8
logging_steps = 1
save_strategy = no
[generation]
kv_cache_bytes = 16000000
[grpo]
num_generations = 4
max_completion_length = 32
[reward.len]
{reward}
""")
    subprocess.run(ctrl + ["train", f"{d}/{name}.ini"], check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, cwd=ROOT)
    rows = [json.loads(l) for l in open(f"{d}/{name}/metrics.jsonl")]
    return [{k: v for k, v in r.items() if not k.startswith("timing/") and k not in ("tokens_per_second", "step_time")} for r in rows]


def prepare(ctrl, d):
    """The prompts and the tiny model the runs train, in d."""
    tiny_quickstart(ctrl, ROOT, d)


def main():
    build = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "build")
    ctrl = [os.path.join(build, "ctrl"), "--plugin-dir", os.path.join(build, "plugins")]
    with tempfile.TemporaryDirectory() as d:
        prepare(ctrl, d)
        builtin = run(ctrl, d, "builtin", "plugin = length\ntarget_length = 20")
        python = run(ctrl, d, "python", f"plugin = command\ncommand = {sys.executable} "
                     "examples/rewards/trl_reward_command.py examples/rewards/reward_len.py:reward_len")
        for a, b in zip(builtin, python):
            diff = {k: (a[k], b.get(k)) for k in a if a[k] != b.get(k)}
            assert not diff, f"step {a.get('step')}: the Python reward's run differs: {diff}"
        first, last = builtin[0]["rewards/len/mean"], builtin[-1]["rewards/len/mean"]
        print(f"ok: {len(python)} logged steps identical with TRL's reward_len in Python and the built-in length "
              f"reward; rewards/len/mean {first} -> {last}")
        assert last > first, "the length reward did not rise"
    return 0


if __name__ == "__main__":
    sys.exit(main())
