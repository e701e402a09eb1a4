#!/usr/bin/env python3
"""TRL's SFTTrainer loss curves on a tiny model, for tests/e2e/test_trl_parity.sh.

Builds tests/fixtures/trl_sft/: a random-init Qwen2-shaped model (hidden 64, 2 layers, GQA, tied
embeddings) with the committed tiny tokenizer, arithmetic data as prompt-completion JSONL and as
messages JSONL; then, for each case, runs TRL (CPU, fp32 — or bf16 autocast where the case says —, dropout off, rows in file order) for 20
optimizer steps and writes <case>.ini (the same run as a ctrl config, with @DIR@ for this folder
and @OUT@ for the output directory) and <case>.trl.jsonl (per-step loss, grad_norm, learning_rate,
entropy, mean_token_accuracy, num_tokens as TRL logs them at logging_steps = 1).
Run by hand: python3 tests/reference/make_trl_sft_curves.py [CASE...] (cases only: the model and data kept)
"""
import json
import os
import random
import shutil
import sys
import tempfile

import torch
from datasets import Dataset
from torch.utils.data import SequentialSampler
from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM, TrainerCallback
from trl import SFTConfig, SFTTrainer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fixture_io import run_curve_cases, write_jsonl  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
FIX = os.path.join(HERE, "..", "fixtures")
OUT = os.path.join(FIX, "trl_sft")
TOK = os.path.join(FIX, "tokenizer", "tiny_bpe")
TRAINING_TEMPLATE = os.path.join(FIX, "templates", "qwen2_5_training.jinja")
STEPS = 20

COMMON = dict(learning_rate=1e-3, lr_scheduler_type="linear", warmup_steps=2, weight_decay=0.01, max_grad_norm=1.0,
              adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8, seed=42, max_length=64)

# case: (data file, SFTConfig overrides, ctrl [data]/[train] lines)
CASES = {
    "padded": ("prompt_completion.jsonl", dict(per_device_train_batch_size=4), {"padding_free": "false"}),
    # TRL enforces no max_length with padding-free batches (the rows here are far shorter anyway)
    "padding_free": ("prompt_completion.jsonl", dict(per_device_train_batch_size=4, padding_free=True,
                                                     max_length=None), {}),
    "full_loss": ("prompt_completion.jsonl", dict(per_device_train_batch_size=4, completion_only_loss=False),
                  {"completion_only_loss": "false"}),
    # the template's default system prompt is long in this tiny vocabulary: room for it
    "assistant_only": ("messages.jsonl", dict(per_device_train_batch_size=4, assistant_only_loss=True,
                                              chat_template_path=TRAINING_TEMPLATE, max_length=256),
                       {"assistant_only_loss": "true", "chat_template_path": "@DIR@/qwen2_5_training.jinja",
                        "max_length": "256"}),
    "grad_accum": ("prompt_completion.jsonl", dict(per_device_train_batch_size=2, gradient_accumulation_steps=2),
                   {"per_device_train_batch_size": "2", "gradient_accumulation_steps": "2"}),
    "bfd_packing": ("prompt_completion.jsonl", dict(per_device_train_batch_size=2, packing=True,
                                                    packing_strategy="bfd", shuffle_dataset=False),
                    {"per_device_train_batch_size": "2", "packing": "true", "packing_strategy": "bfd"}),
    # rows are 6-10 tokens: at 8, bfd_split cuts the longer ones and packs the tails elsewhere
    "bfd_split_packing": ("prompt_completion.jsonl", dict(per_device_train_batch_size=2, packing=True,
                                                          packing_strategy="bfd_split", shuffle_dataset=False,
                                                          max_length=8),
                          {"per_device_train_batch_size": "2", "packing": "true", "packing_strategy": "bfd_split",
                           "max_length": "8"}),
    # wrapped blocks are padded rows in TRL (no padding-free forcing as with bfd)
    "wrapped_packing": ("prompt_completion.jsonl", dict(per_device_train_batch_size=2, packing=True,
                                                        packing_strategy="wrapped", shuffle_dataset=False,
                                                        max_length=24),
                        {"per_device_train_batch_size": "2", "packing": "true", "packing_strategy": "wrapped",
                         "padding_free": "false", "max_length": "24"}),
    "padded_multiple": ("prompt_completion.jsonl", dict(per_device_train_batch_size=4, pad_to_multiple_of=8),
                        {"padding_free": "false", "pad_to_multiple_of": "8"}),
    # TRL counts the padding of the flat row in num_tokens
    "padding_free_multiple": ("prompt_completion.jsonl", dict(per_device_train_batch_size=4, padding_free=True,
                                                              max_length=None, pad_to_multiple_of=8),
                              {"pad_to_multiple_of": "8"}),
    # bf16 mixed precision: TRL runs the model under torch.autocast(bfloat16) with fp32 master weights
    "padded_bf16": ("prompt_completion.jsonl", dict(per_device_train_batch_size=4, bf16=True),
                    {"padding_free": "false", "dtype": "bf16"}),
}
TRAIN_KEYS = {"per_device_train_batch_size", "gradient_accumulation_steps", "dtype"}


def make_data():
    rng = random.Random(3)
    rows, chats = [], []
    for _ in range(160):
        a, b = rng.randrange(100), rng.randrange(100)
        q, ans = f"{a}+{b}=", str(a + b)
        rows.append({"prompt": q, "completion": ans})
        chats.append({"messages": [{"role": "user", "content": f"What is {a} plus {b}?"},
                                   {"role": "assistant", "content": f"{a} plus {b} is {ans}."}]})
    for name, data in (("prompt_completion.jsonl", rows), ("messages.jsonl", chats)):
        with open(os.path.join(OUT, name), "w") as f:
            for r in data:
                f.write(json.dumps(r) + "\n")


def make_model():
    tok = AutoTokenizer.from_pretrained(TOK)
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=True,
                      rms_norm_eps=1e-6, rope_theta=10000.0, attention_dropout=0.0, bos_token_id=None,
                      eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    model = Qwen2ForCausalLM(cfg)
    model.save_pretrained(os.path.join(OUT, "model"), safe_serialization=True)
    # The tokenizer files as they are: save_pretrained would record tokenizer_class Qwen2Tokenizer, and
    # transformers 5 would then replace the file's pre-tokenizer with Qwen2's.
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(TOK, name), os.path.join(OUT, "model", name))


def sequential(trainer_cls):
    """The trainer with rows in file order, so that ctrl (shuffle = false) sees the same batches."""

    class Sequential(trainer_cls):
        def _get_train_sampler(self, *args, **kwargs):
            return SequentialSampler(self.train_dataset)

    return Sequential


Sequential = sequential(SFTTrainer)


class Record(TrainerCallback):
    """The logged values of `keys` at every logging step."""

    def __init__(self, keys=("loss", "grad_norm", "learning_rate", "entropy", "mean_token_accuracy", "num_tokens")):
        self.rows, self.keys = [], keys

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            self.rows.append({"step": state.global_step, **{k: logs[k] for k in self.keys if k in logs}})


def run_case(name, data_file, overrides):
    # From the tokenizer's own folder: next to a config.json with model_type qwen2, transformers 5
    # would load Qwen2Tokenizer, which swaps in Qwen2's pre-tokenizer for the file's.
    tok = AutoTokenizer.from_pretrained(TOK)
    model = Qwen2ForCausalLM.from_pretrained(os.path.join(OUT, "model"), attn_implementation="eager")
    rows = [json.loads(l) for l in open(os.path.join(OUT, data_file))]
    rec = Record()
    with tempfile.TemporaryDirectory() as tmp:
        args = SFTConfig(output_dir=tmp, report_to=[], use_cpu=True, max_steps=STEPS, logging_steps=1,
                         save_strategy="no", optim="adamw_torch", dataloader_drop_last=False, **dict(dict(COMMON, bf16=False), **overrides))
        trainer = Sequential(model=model, args=args, train_dataset=Dataset.from_list(rows), processing_class=tok,
                             callbacks=[rec])
        trainer.train()
    write_jsonl(os.path.join(OUT, name + ".trl.jsonl"), rec.rows)
    return rec.rows


def write_ini(name, data_file, ctrl_opts):
    data = {"train_file": "@DIR@/" + data_file, "max_length": str(COMMON["max_length"]), "shuffle": "false"}
    train = {"dtype": "fp32", "learning_rate": str(COMMON["learning_rate"]), "lr_scheduler_type": "linear",
             "warmup_steps": str(COMMON["warmup_steps"]), "weight_decay": str(COMMON["weight_decay"]),
             "max_grad_norm": "1.0", "max_steps": str(STEPS), "logging_steps": "1", "per_device_train_batch_size": "4",
             "optimizer": "adamw"}
    for k, v in ctrl_opts.items():
        (train if k in TRAIN_KEYS else data)[k] = v
    lines = ["[run]", "output_dir = @OUT@", "device = cpu", "seed = 42", "", "[model]", "path = @DIR@/model",
             "attention = eager", "", "[data]"] + [f"{k} = {v}" for k, v in data.items()] + ["", "[train]"] + \
            [f"{k} = {v}" for k, v in train.items()] + ["", "[adamw]", "adam_beta1 = 0.9", "adam_beta2 = 0.999",
                                                        "adam_epsilon = 1e-8", ""]
    with open(os.path.join(OUT, name + ".ini"), "w") as f:
        f.write("\n".join(lines))


def setup():
    shutil.copy(TRAINING_TEMPLATE, OUT)
    make_data()
    make_model()


def main(names):  # no names: everything from scratch; named cases reuse the model and data already there
    run_curve_cases(names, OUT, CASES, setup, lambda name, case: run_case(name, *case[:2]),
                    lambda name, case: write_ini(name, case[0], case[2]), seed=None)


if __name__ == "__main__":
    main(sys.argv[1:])
