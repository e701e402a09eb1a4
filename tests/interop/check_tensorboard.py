#!/usr/bin/env python3
"""Interop: a `ctrl train` run with `[train] report_to = tensorboard`, read back by the tensorboard
package's own EventAccumulator -- every number of every metrics.jsonl line must be there as a
scalar at that step under the HF Trainer's tag (train/x, eval/x). Skips, saying so, without the
tensorboard package. usage: check_tensorboard.py BUILD_DIR (after scripts/build.sh)"""
import glob
import json
import math
import os
import subprocess
import sys
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "reference"))  # fixture_io, shared with the fixture writers
from fixture_io import tiny_quickstart  # noqa: E402


def main():
    try:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    except ImportError:
        print("skipped: the tensorboard package is not installed")
        return 0
    build = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "build")
    ctrl = [os.path.join(build, "ctrl"), "--plugin-dir", os.path.join(build, "plugins")]
    with tempfile.TemporaryDirectory() as d:
        tiny_quickstart(ctrl, ROOT, d)
        with open(f"{d}/run.ini", "w") as f:
            f.write(f"[run]\noutput_dir = {d}/out\ndevice = cpu\n[model]\npath = {d}/model\n[data]\n"
                    f"train_file = {d}/data/train.jsonl\neval_file = {d}/data/eval.jsonl\n[train]\nmax_steps = 6\n"
                    "logging_steps = 2\neval_steps = 3\nsave_strategy = no\nreport_to = tensorboard\n")
        subprocess.run(ctrl + ["train", f"{d}/run.ini"], check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        files = glob.glob(f"{d}/out/runs/events.out.tfevents.*")
        assert len(files) == 1, files
        acc = EventAccumulator(files[0], size_guidance={"scalars": 0})
        acc.Reload()
        checked = 0
        for line in open(f"{d}/out/metrics.jsonl"):
            rec = json.loads(line)
            for k, v in rec.items():
                if k == "step" or not isinstance(v, (int, float)):
                    continue
                tag = "eval/" + k[5:] if k.startswith("eval_") else "train/" + k
                got = [e.value for e in acc.Scalars(tag) if e.step == rec["step"]]
                assert got and math.isclose(got[0], v, rel_tol=1e-6, abs_tol=1e-30), (tag, rec["step"], got, v)
                checked += 1
        print(f"ok: {checked} scalars of metrics.jsonl read back by TensorBoard's EventAccumulator "
              f"({len(acc.Tags()['scalars'])} tags)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
