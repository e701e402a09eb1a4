#!/usr/bin/env python3
"""Preference data prepared by TRL 1.16 itself, for tests/unit/test_pref_data.c.

For each case, TRL's own trainer (DPOTrainer, KTOTrainer or RewardTrainer) is instantiated on the
committed tiny model with a small dataset, and what it makes of the rows is dumped:
  tests/fixtures/pref/<case>.jsonl           the dataset rows as given
  tests/fixtures/pref/<case>.options.json    {"task", "tokenizer", "data": {[data] keys}, "batch_size"}
                                             (chat_template_path relative to tests/fixtures)
  tests/fixtures/pref/<case>.expected.jsonl  trainer.train_dataset's ids, row for row (the rows TRL
                                             keeps, in its order): DPO prompt_ids / chosen_ids /
                                             rejected_ids; KTO prompt_ids / completion_ids /
                                             KL_completion_ids / label; reward chosen_ids /
                                             rejected_ids / margin
  tests/fixtures/pref/<case>.batch.json      trainer.data_collator on the first batch_size rows
                                             (max_length truncation, padding, pad_to_multiple_of)
                                             and, for DPO and KTO with the tiny tokenizer, "logps":
                                             trainer.compute_ref_log_probs on that batch (TRL's own
                                             per-sequence log-probs: chosen then rejected, or the
                                             completions then the KL sequences) under
                                             tests/fixtures/trl_sft/model
Tokenizers: the tiny BPE one (tests/fixtures/tokenizer/tiny_bpe), Qwen3's and Llama 3's with their chat
templates and Llama 2's (../shared/data/tokenizers/NAME, or $CTRL_SHARED_DIR/data/tokenizers/NAME;
those cases are skipped by the C test where they are absent).
Run by hand: /work/venv/bin/python tests/reference/make_pref_data_fixtures.py [CASE...]
"""
import json
import os
import sys
import tempfile

import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer
from trl import DPOConfig, DPOTrainer, KTOConfig, KTOTrainer, RewardConfig, RewardTrainer

HERE = os.path.dirname(os.path.abspath(__file__))
FIX = os.path.join(HERE, "..", "fixtures")
OUT = os.path.join(FIX, "pref")
MODEL = os.path.join(FIX, "models", "qwen2")  # vocabulary of 128: data preparation only
LOGP_MODEL = os.path.join(FIX, "trl_sft", "model")  # the tiny tokenizer's vocabulary: sequence log-probs
TOKENIZERS = {"tiny": os.path.join(FIX, "tokenizer", "tiny_bpe"),
              **{name: os.path.join(os.environ.get("CTRL_SHARED_DIR", os.path.join(HERE, "..", "..", "..", "shared")),
                                    "data", "tokenizers", name) for name in ("qwen3", "llama3", "llama2")}}

QA = [("What is 12 + 7?", "19", "21"), ("Spell cat backwards.", "tac", "cat"),
      ("Capital of France?", "Paris.", "Lyon, I think."), ("Translate 'hello' to Spanish.", "hola", "bonjour"),
      ("2 * 21 = ?", "42", "44<|im_end|>"), ("Largest planet?", "Jupiter is the largest.", "Saturn — ringed.")]


def conv(role, content):
    return {"role": role, "content": content}


def standard():
    return [{"prompt": f"Q: {q} A:", "chosen": f" {c}", "rejected": f" {r}"} for q, c, r in QA]


def conversational(system_every=2):
    rows = []
    for i, (q, c, r) in enumerate(QA):
        p = ([conv("system", "Be terse.")] if i % system_every == 0 else []) + [conv("user", q)]
        rows.append({"prompt": p, "chosen": [conv("assistant", c)], "rejected": [conv("assistant", r)]})
    return rows


def implicit():
    rows = [{"chosen": f"Q: {q} A: {c}", "rejected": f"Q: {q} A: {r}"} for q, c, r in QA]
    rows += [
        {"chosen": "Café — naïve: oui", "rejected": "Café — naïve: non"},  # multi-byte characters before
        {"chosen": "abc", "rejected": "abcdef"},  # one a prefix of the other: the loop's last index
        {"chosen": "x y ", "rejected": "z"},  # differ at 0, chosen ends with a space: Python's chosen[-1]
        {"chosen": "same", "rejected": "same"},
    ]
    return rows


def implicit_conversational():
    rows = []
    for q, c, r in QA[:4]:
        rows.append({"chosen": [conv("user", q), conv("assistant", c)],
                     "rejected": [conv("user", q), conv("assistant", r)]})
    rows.append({"chosen": [conv("system", "S"), conv("user", "hi"), conv("assistant", "a"), conv("user", "more"),
                            conv("assistant", "b")],
                 "rejected": [conv("system", "S"), conv("user", "hi"), conv("assistant", "a"), conv("user", "more"),
                              conv("assistant", "c")]})
    return rows


def unpaired():
    rows = []
    for i, (q, c, r) in enumerate(QA):
        rows.append({"prompt": f"Q: {q} A:", "completion": f" {c if i % 3 else r}", "label": bool(i % 3)})
    rows.append({"prompt": "Q: odd one A:", "completion": " out", "label": True})
    return rows


def unpaired_conversational():
    return [{"prompt": [conv("user", q)], "completion": [conv("assistant", c if i % 2 else r)], "label": bool(i % 2)}
            for i, (q, c, r) in enumerate(QA)]


TOOL = {"type": "function", "function": {"name": "add", "description": "Add two numbers.",
                                          "parameters": {"type": "object", "properties": {
                                              "a": {"type": "number"}, "b": {"type": "number"}}}}}


def with_template_kwargs():
    """chat_template_kwargs (Qwen3's enable_thinking: false ends the generation prompt in an empty
    think block the full conversation does not have) and tools (a JSON string, as TRL parses it)."""
    rows = conversational()
    for i, r in enumerate(rows):  # a datasets column has one type: every row has both keys
        r["chat_template_kwargs"] = {"enable_thinking": i % 2 == 1}
        r["tools"] = json.dumps([TOOL]) if i % 3 == 1 else None
    return rows


def with_margin(rows):
    return [dict(r, margin=0.25 * i) for i, r in enumerate(rows)]


def pretokenized(legacy=False):
    """Already tokenized pairs (RewardTrainer's is_processed path; the legacy column names renamed)."""
    c, r = ("chosen_input_ids", "rejected_input_ids") if legacy else ("chosen_ids", "rejected_ids")
    return [{c: [5 + i, 17, 300 + i, 2][: 2 + i % 3], r: [5 + i, 40 + i] * (1 + i % 4), "margin": i / 4}
            for i in range(6)]


def empty_prompt():
    """An empty prompt with a tokenizer without BOS: the first completion token starts the sequence,
    and no log-prob predicts it (TRL's completion_mask still counts it, IPO and sigmoid_norm divide
    by that count)."""
    return [{"prompt": "", "chosen": c, "rejected": r} for _, c, r in QA]


def long_prompts():
    return [{"prompt": f"Q: {q} " * (1 + i % 3) + "A:", "chosen": f" {c}", "rejected": f" {r}"}
            for i, (q, c, r) in enumerate(QA)]


CASES = {
    # name: (task, tokenizer, rows, [data] options, batch size)
    "dpo_standard": ("dpo", "tiny", standard(), {}, 3),
    "dpo_conversational": ("dpo", "tiny", conversational(), {}, 3),
    "dpo_implicit": ("dpo", "tiny", implicit(), {}, 4),
    "dpo_implicit_conversational": ("dpo", "tiny", implicit_conversational(), {}, 3),
    "dpo_keep_start": ("dpo", "tiny", long_prompts(), {"max_length": 24, "pad_to_multiple_of": 8}, 3),
    "dpo_keep_end": ("dpo", "tiny", long_prompts(), {"max_length": 12, "truncation_mode": "keep_end"}, 3),
    "dpo_empty_prompt": ("dpo", "tiny", empty_prompt(), {}, 3),
    "dpo_standard_qwen3": ("dpo", "qwen3", standard(), {"pad_to_multiple_of": 4}, 3),
    "dpo_conversational_qwen3": ("dpo", "qwen3", conversational(), {}, 3),
    "dpo_template_kwargs_qwen3": ("dpo", "qwen3", with_template_kwargs(), {}, 3),
    "dpo_implicit_conversational_qwen3": ("dpo", "qwen3", implicit_conversational(), {}, 3),
    "dpo_chat_template": ("dpo", "tiny", conversational(1), {"chat_template_path": "templates/qwen2_5_training.jinja"},
                          3),
    # BOS: Llama 3's template writes it, tokenizer(text) adds it (Llama 2 too); neither has a pad token
    # (TRL pads with EOS, which standard rows also end with: the reward's last non-pad token moves)
    "dpo_standard_llama3": ("dpo", "llama3", standard(), {}, 3),
    "dpo_conversational_llama3": ("dpo", "llama3", conversational(), {}, 3),
    "dpo_implicit_llama2": ("dpo", "llama2", implicit(), {}, 3),
    "dpo_standard_llama2": ("dpo", "llama2", standard(), {"max_length": 16, "truncation_mode": "keep_end"}, 3),
    "kto_unpaired_llama3": ("kto", "llama3", unpaired(), {}, 3),
    "reward_standard_llama3": ("reward", "llama3", with_margin(standard()), {}, 3),
    "reward_conversational_llama3": ("reward", "llama3", conversational(), {}, 3),
    "kto_unpaired": ("kto", "tiny", unpaired(), {}, 3),
    "kto_paired": ("kto", "tiny", standard(), {}, 4),
    "kto_implicit": ("kto", "tiny", implicit()[:6], {}, 3),
    "kto_max_length": ("kto", "tiny", long_prompts(), {"max_length": 22, "pad_to_multiple_of": 8}, 3),
    "kto_conversational_qwen3": ("kto", "qwen3", unpaired_conversational(), {}, 3),
    "kto_template_kwargs_qwen3": ("kto", "qwen3", with_template_kwargs(), {}, 3),
    "reward_standard": ("reward", "tiny", with_margin(standard()), {}, 3),
    "reward_conversational": ("reward", "tiny", conversational(), {"pad_to_multiple_of": 8}, 3),
    "reward_chat_template": ("reward", "tiny", conversational(),
                             {"chat_template_path": "templates/qwen2_5_training.jinja"}, 3),
    "reward_implicit": ("reward", "tiny", implicit()[:6], {}, 3),
    "reward_pretokenized": ("reward", "tiny", pretokenized(), {"max_length": 7}, 3),
    "reward_pretokenized_legacy": ("reward", "tiny", pretokenized(legacy=True), {}, 3),
    "reward_max_length": ("reward", "tiny", long_prompts(), {"max_length": 20}, 3),
    "reward_conversational_qwen3": ("reward", "qwen3", with_margin(conversational()), {}, 3),
}


def common(tmp, options, bs):
    return dict(output_dir=tmp, report_to=[], use_cpu=True, bf16=False, dataset_num_proc=None,
                per_device_train_batch_size=bs, max_length=options.get("max_length", 1024),
                pad_to_multiple_of=options.get("pad_to_multiple_of"))


def ids(x):
    return [int(v) for v in x]


def prepare(task, tok_name, rows, options, bs):
    tok = AutoTokenizer.from_pretrained(TOKENIZERS[tok_name])
    template = os.path.join(FIX, options["chat_template_path"]) if "chat_template_path" in options else None
    if template and task != "reward":  # DPOConfig / KTOConfig have no chat_template_path: the tokenizer's
        with open(template, encoding="utf-8") as f:
            tok.chat_template = f.read()
    ds = Dataset.from_list(rows)
    model_dir = LOGP_MODEL if tok_name == "tiny" else MODEL
    with tempfile.TemporaryDirectory() as tmp:
        if task == "dpo":
            model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
            args = DPOConfig(**common(tmp, options, bs), truncation_mode=options.get("truncation_mode", "keep_start"))
            trainer = DPOTrainer(model=model, args=args, train_dataset=ds, processing_class=tok)
            keys = ["prompt_ids", "chosen_ids", "rejected_ids"]
        elif task == "kto":
            model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
            args = KTOConfig(**common(tmp, options, bs))
            trainer = KTOTrainer(model=model, args=args, train_dataset=ds, processing_class=tok)
            keys = ["prompt_ids", "completion_ids", "KL_completion_ids", "label"]
        else:
            model = AutoModelForSequenceClassification.from_pretrained(model_dir, num_labels=1, dtype=torch.float32)
            args = RewardConfig(**common(tmp, options, bs), chat_template_path=template)
            trainer = RewardTrainer(model=model, args=args, train_dataset=ds, processing_class=tok)
            keys = ["chosen_ids", "rejected_ids"] + (["margin"] if "margin" in rows[0] else [])
        data = trainer.train_dataset
        expected = []
        for r in data:
            e = {}
            for k in keys:
                e[k] = ids(r[k]) if k.endswith("_ids") else r[k]
            expected.append(e)
        examples = [data[i] for i in range(min(bs, len(data)))]
        batch = trainer.data_collator(examples)
        logps = None
        if task != "reward" and tok_name == "tiny":
            out = trainer.compute_ref_log_probs(trainer.ref_model, batch)
            logps = [float(x) for part in out for x in part.tolist()]
        batch = {k: v.tolist() for k, v in batch.items() if torch.is_tensor(v)}
        if logps is not None:
            batch["logps"] = logps
        return expected, batch, tok.pad_token_id


def main():
    os.makedirs(OUT, exist_ok=True)
    only = set(sys.argv[1:])  # case names to remake (default: all)
    for name, (task, tok_name, rows, options, bs) in CASES.items():
        if only and name not in only:
            continue
        if not os.path.isdir(TOKENIZERS[tok_name]):
            print(name, "skipped: no tokenizer at", TOKENIZERS[tok_name])
            continue
        expected, batch, pad = prepare(task, tok_name, rows, options, bs)
        with open(os.path.join(OUT, name + ".jsonl"), "w", encoding="utf-8") as f:
            for r in rows:
                f.write(json.dumps(r, ensure_ascii=False) + "\n")
        with open(os.path.join(OUT, name + ".expected.jsonl"), "w", encoding="utf-8") as f:
            for r in expected:
                f.write(json.dumps(r) + "\n")
        with open(os.path.join(OUT, name + ".batch.json"), "w", encoding="utf-8") as f:
            json.dump(dict(batch, pad_token_id=pad), f, separators=(",", ":"))
        with open(os.path.join(OUT, name + ".options.json"), "w", encoding="utf-8") as f:
            json.dump({"task": task, "tokenizer": tok_name, "data": options, "batch_size": bs}, f)
        print(name, len(expected), "rows")


if __name__ == "__main__":
    main()
