#!/usr/bin/env python3
"""Serves a TRL-style reward function, unchanged, to ctrl's `command` reward plugin.

    [reward.len]
    plugin = command
    command = python3 examples/rewards/trl_reward_command.py examples/rewards/reward_len.py:reward_len

ctrl starts this once and writes one JSON batch per line to its stdin: "prompts", "completions",
"completion_ids" (lists, one entry per completion) and the dataset row's other columns (e.g.
"solution"), each a list too. The function is called as TRL's GRPOTrainer calls a reward
function -- reward_func(prompts=..., completions=..., completion_ids=..., **columns) -- and its
list of floats (None where the reward does not apply) goes back as one JSON line. Prompts and
completions are text (a conversational dataset's prompt is the chat template's rendering).
Anything the function prints goes to stderr, so that stdout carries the replies alone.
usage: trl_reward_command.py FILE.py:FUNCTION | MODULE:FUNCTION"""
import importlib
import importlib.util
import json
import os
import sys


def load(spec):
    where, _, name = spec.rpartition(":")
    if not where or not name:
        sys.exit(f"trl_reward_command: expected FILE.py:FUNCTION or MODULE:FUNCTION, got {spec!r}")
    if where.endswith(".py") or os.path.sep in where:
        s = importlib.util.spec_from_file_location(os.path.splitext(os.path.basename(where))[0], where)
        module = importlib.util.module_from_spec(s)
        s.loader.exec_module(module)
    else:
        module = importlib.import_module(where)
    return getattr(module, name)


def main():
    replies = sys.stdout
    sys.stdout = sys.stderr  # the function's prints must not reach the reply channel
    func = load(sys.argv[1] if len(sys.argv) > 1 else "")
    for line in sys.stdin:
        batch = json.loads(line)
        prompts, completions = batch.pop("prompts"), batch.pop("completions")
        ids = batch.pop("completion_ids")
        scores = func(prompts=prompts, completions=completions, completion_ids=ids, **batch)
        replies.write(json.dumps([None if s is None else float(s) for s in scores]) + "\n")
        replies.flush()


if __name__ == "__main__":
    main()
