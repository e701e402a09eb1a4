#!/usr/bin/env python3
"""TensorBoard event-file fixtures written by the tensorboard package itself (its RecordWriter and
Event/Summary protocol buffers, as torch.utils.tensorboard.SummaryWriter.add_scalar fills them:
Summary.Value(tag, simple_value)), for tests/unit/test_tensorboard.c, which writes the same events
through core/train/tensorboard.c and compares the files byte for byte. The HF Trainer's tags
(transformers' rewrite_logs: eval_x -> eval/x, others train/x) are recorded for the metrics-line case.
usage: /work/venv/bin/python tests/reference/make_tensorboard_fixtures.py (tensorboard 2.x)"""
import json
import os

from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.summary.writer.record_writer import RecordWriter

OUT = os.path.join(os.path.dirname(__file__), "..", "fixtures", "tensorboard")

# (wall_time, step, [(tag, value), ...]); the first event is the file_version one
FIRST_WALL_TIME = 1764230400.25
EVENTS = [
    (1764230401.5, 1, [("train/loss", 2.3125), ("train/learning_rate", 5e-05)]),
    (1764230402.75, 10, [("train/loss", 1.0009765625), ("train/grad_norm", 0.1), ("train/epoch", 0.5)]),
    (1764230403.0, 300, [("eval/loss", -0.0), ("eval/rewards/accuracies", 0.875)]),
    (1764230404.125, 2**40 + 3, [("train/a tag with spaces and ünïcödé", 3.4e38)]),
    (1764230405.0, 0, [("train/zero", 0.0), ("train/tiny", 1e-45)]),  # proto3 leaves out zeros
]
# a metrics.jsonl line and the scalars the HF Trainer's TensorBoard callback logs for it
METRICS_LINE = {"step": 20, "loss": 0.5, "grad_norm": 1.25, "eval_loss": 0.75, "mode": "x", "epoch": 2.0}


def rewrite_logs(d):  # transformers.integrations.integration_utils.rewrite_logs, for numbers
    out = {}
    for k, v in d.items():
        if k == "step" or not isinstance(v, (int, float)):
            continue
        out[("eval/" + k[5:]) if k.startswith("eval_") else ("test/" + k[5:]) if k.startswith("test_")
            else "train/" + k] = v
    return out


def write(path, first, events):
    with open(path, "wb") as f:
        w = RecordWriter(f)
        w.write(event_pb2.Event(wall_time=first, file_version="brain.Event:2").SerializeToString())
        for t, step, scalars in events:
            summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=k, simple_value=v) for k, v in scalars])
            w.write(event_pb2.Event(wall_time=t, step=step, summary=summary).SerializeToString())


def main():
    os.makedirs(OUT, exist_ok=True)
    write(os.path.join(OUT, "events.bin"), FIRST_WALL_TIME, EVENTS)
    line_scalars = list(rewrite_logs(METRICS_LINE).items())
    write(os.path.join(OUT, "metrics_line.bin"), FIRST_WALL_TIME, [(FIRST_WALL_TIME, METRICS_LINE["step"], line_scalars)])
    with open(os.path.join(OUT, "events.json"), "w") as f:
        json.dump({"first_wall_time": FIRST_WALL_TIME,
                   "events": [{"wall_time": t, "step": s, "tags": [k for k, _ in sc], "values": [v for _, v in sc]}
                              for t, s, sc in EVENTS],
                   "metrics_line": json.dumps(METRICS_LINE), "metrics_line_tags": [k for k, _ in line_scalars]},
                  f, indent=1, ensure_ascii=False)
    print("wrote", OUT)


if __name__ == "__main__":
    main()
