"""Writes the project's binary fixture format (read by tests/fixture.c).

Layout: a text header of lines "name count" ending with a line "end", then the arrays as
little-endian float32 in header order. Integers are stored as floats (exact below 2^24).
"""
import struct


def write_fixture(path, arrays, comment=""):
    with open(path, "wb") as f:
        if comment:
            f.write(("# " + comment.replace("\n", " ") + "\n").encode())
        for name, values in arrays:
            f.write(("%s %d\n" % (name, len(values))).encode())
        f.write(b"end\n")
        for _, values in arrays:
            f.write(struct.pack("<%df" % len(values), *values))


def randomize_params(model, torch):
    """Random weights, not the init's near-zero values, so that every path carries signal: norms
    1 + 0.1 N(0, 1), everything else 0.08 N(0, 1) (torch's global generator)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            else:
                p.copy_(0.08 * torch.randn_like(p))


def write_curve_ini(path, trainer, common, steps, model, train_file, train_opts, trainer_opts, eval_file=None):
    """The ctrl config of a curve case (make_trl_{dpo,kto,reward}_curves.py): the run TRL made with
    `common` (learning_rate, warmup_steps, weight_decay) for `steps` steps, fp32, eager attention,
    rows in file order, AdamW; `train_opts` added to / replacing [train]'s keys, `trainer_opts` the
    [TRAINER] section. @OUT@, @DIR@, @SFT@ and @MODEL@ are left for the test to replace."""
    train = {"dtype": "fp32", "learning_rate": str(common["learning_rate"]), "lr_scheduler_type": "linear",
             "warmup_steps": str(common["warmup_steps"]), "weight_decay": str(common["weight_decay"]),
             "max_grad_norm": "1.0", "max_steps": str(steps), "logging_steps": "1", "per_device_train_batch_size": "4",
             "optimizer": "adamw", "save_strategy": "no"}
    train.update(train_opts)
    lines = ["[run]", f"trainer = {trainer}", "output_dir = @OUT@", "device = cpu", "seed = 42", "", "[model]",
             f"path = {model}", "attention = eager", "", "[data]", f"train_file = {train_file}"] + \
            ([f"eval_file = {eval_file}"] if eval_file else []) + \
            ["shuffle = false", "", "[train]"] + [f"{k} = {v}" for k, v in train.items()] + \
            ["", "[adamw]", "adam_beta1 = 0.9", "adam_beta2 = 0.999", "adam_epsilon = 1e-8", "", f"[{trainer}]"] + \
            [f"{k} = {v}" for k, v in trainer_opts.items()] + [""]
    with open(path, "w") as f:
        f.write("\n".join(lines))


def save_peft_adapter(pm, path, base_name):
    """PEFT's save_pretrained into `path` without its README, base_model_name_or_path set to
    `base_name` (a path relative to tests/fixtures, not this machine's)."""
    import json
    import os
    pm.save_pretrained(path)
    os.remove(os.path.join(path, "README.md"))
    cpath = os.path.join(path, "adapter_config.json")
    with open(cpath) as f:
        ac = json.load(f)
    ac["base_model_name_or_path"] = base_name
    with open(cpath, "w") as f:
        json.dump(ac, f, indent=2, sort_keys=True)
