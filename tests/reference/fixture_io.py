"""Writes the project's binary fixture format (read by tests/fixture.c).

Layout: a text header of lines "name count" ending with a line "end", then the arrays as
little-endian float32 in header order. Integers are stored as floats (exact below 2^24).

Also what the reference scripts share (one place each): a TRL case's files (write_trl_case), a packed
batch's next-token log-probs and the bf16 model fixtures (packed_logps, write_bf16_batch), the
quickstart data with a tiny model (tiny_quickstart), the curve scripts' main and configs
(run_curve_cases, write_jsonl, write_curve_ini), random weights and PEFT adapters.
"""
import os
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


def write_trl_case(out, name, arrays, grads=None):
    """A TRL parity case: out/name.bin (write_fixture, commented with TRL's version and the name) and,
    with grads, out/name.grads.safetensors."""
    import trl

    write_fixture(os.path.join(out, name + ".bin"), arrays, f"trl {trl.__version__} {name}")
    if grads:
        from safetensors.torch import save_file

        save_file(grads, os.path.join(out, name + ".grads.safetensors"))


def packed_logps(model, torch, cu, tokens, autocast=False):
    """Each sequence of a packed batch (cu_seqlens cu, tokens) through model on its own, under
    torch.autocast("cpu", bfloat16) with autocast: (the log-prob of each next token as a list, 0.0 at
    each sequence's last token; the mean loss over the predicted tokens, a tensor to backward())."""
    total = sum(cu[i + 1] - cu[i] - 1 for i in range(len(cu) - 1))
    logps, loss_sum = [], 0.0
    for i in range(len(cu) - 1):
        seq = torch.tensor(tokens[cu[i]:cu[i + 1]])
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            logits = model(input_ids=seq[None]).logits[0]
        lp = torch.log_softmax(logits.float(), dim=-1)
        gathered = lp[:-1].gather(1, seq[1:, None])[:, 0]
        loss_sum = loss_sum + (-gathered.sum())
        logps += gathered.tolist() + [0.0]
    return logps, loss_sum / total


def write_bf16_batch(d, note, rename=None):
    """The fixture model in d (its batch.json) run as TRL's bf16 = True runs it: fp32 weights, each
    sequence under autocast (packed_logps). Writes d/batch_bf16.json (the next tokens' log-probs, the
    mean loss, note) and d/grads_bf16.safetensors (every parameter's gradient of that loss, the tied
    LM head's left out; rename(grads, model) may rename them). Returns (the loss, batch.json's)."""
    import json
    import os

    import torch
    import transformers
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager")
    model.eval()
    batch = json.load(open(os.path.join(d, "batch.json")))
    logps, loss = packed_logps(model, torch, batch["cu_seqlens"], batch["tokens"], autocast=True)
    loss.backward()
    grads = {n: p.grad.detach().float().contiguous() for n, p in model.named_parameters() if p.grad is not None}
    if rename:
        grads = rename(grads, model)
    if model.config.tie_word_embeddings:
        grads.pop("lm_head.weight", None)
    save_file(grads, os.path.join(d, "grads_bf16.safetensors"))
    with open(os.path.join(d, "batch_bf16.json"), "w") as f:
        json.dump({"logp": logps, "loss": loss.item(), "note": "torch %s, transformers %s, autocast bf16 (%s)" % (
            torch.__version__, transformers.__version__, note)}, f)
    return loss.item(), batch["loss"]


def tiny_quickstart(ctrl, root, d):
    """The quickstart's data (3 rows of each kind: scripts/make_quickstart_data.sh) in d/data and a tiny
    random Qwen2 (hidden 32, 1 layer, 2 heads, the tiny tokenizer) in d/model; ctrl: the command line
    that runs ctrl with its plugins, root: the checkout."""
    import subprocess

    subprocess.run(["bash", os.path.join(root, "scripts", "make_quickstart_data.sh"), f"{d}/data", "3"],
                   check=True, stdout=subprocess.DEVNULL)
    subprocess.run(ctrl + ["model", "init", "--arch", "qwen2", "--hidden", "32", "--layers", "1", "--heads", "2",
                           "--tokenizer", os.path.join(root, "tests/fixtures/tokenizer/tiny_bpe"), "--out",
                           f"{d}/model"], check=True, stdout=subprocess.DEVNULL)
def write_jsonl(path, rows):
    """rows (dicts) as JSON lines."""
    import json

    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


def run_curve_cases(names, out, cases, setup, run_case, write_ini, seed=0):
    """The curve scripts' main (make_trl_{sft,dpo,kto}_curves.py): with no names, out emptied and setup()
    run; then each case of cases (or only the named ones: they reuse what setup made) seeded with
    torch.manual_seed(seed) (None: not seeded), run_case(name, case) -> TRL's logged rows,
    write_ini(name, case), and a line of the first six losses."""
    import shutil

    import torch

    if not names:
        if os.path.isdir(out):
            shutil.rmtree(out)
        os.makedirs(out)
        setup()
    for name, case in cases.items():
        if names and name not in names:
            continue
        if seed is not None:
            torch.manual_seed(seed)
        rows = run_case(name, case)
        write_ini(name, case)
        print(name, " ".join("%.5f" % r["loss"] for r in rows[:6]), "...")




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
    if os.path.exists(os.path.join(path, "README.md")):  # PEFT's model card: not a fixture
        os.remove(os.path.join(path, "README.md"))
    cpath = os.path.join(path, "adapter_config.json")
    with open(cpath) as f:
        ac = json.load(f)
    ac["base_model_name_or_path"] = base_name
    with open(cpath, "w") as f:
        json.dump(ac, f, indent=2, sort_keys=True)
