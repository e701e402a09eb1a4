#!/usr/bin/env python3
"""SFT dataset preparation by TRL itself (SFTTrainer's tokenize / build_labels / truncation), for
tests/unit/test_sft_data.c. For each case a small dataset file is written to
tests/fixtures/sft_data/<case>.jsonl (or .json) and TRL's prepared rows to <case>.expected.jsonl:
{"input_ids": [...], "trained": [0/1 per token]} (trained = labels != -100), in order, with the
rows TRL keeps. The tokenizer is the committed tiny one (tests/fixtures/tokenizer/tiny_bpe).
Run by hand: python3 tests/reference/make_sft_data_fixtures.py
"""
import json
import os
import tempfile

from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import SFTConfig, SFTTrainer

HERE = os.path.dirname(os.path.abspath(__file__))
FIX = os.path.join(HERE, "..", "fixtures")
OUT = os.path.join(FIX, "sft_data")
TOK = os.path.join(FIX, "tokenizer", "tiny_bpe")
MODEL = os.path.join(FIX, "models", "qwen2")
TRAINING_TEMPLATE = os.path.join(FIX, "templates", "qwen2_5_training.jinja")

QA = [("What is 12 + 7?", "19"), ("Spell cat backwards.", "tac"), ("Capital of France?", "Paris."),
      ("Translate 'hello' to Spanish.", "hola"), ("2 * 21 = ?", "42"), ("Largest planet?", "Jupiter is the largest.")]


def messages(q, a, system=False):
    m = [{"role": "system", "content": "You are terse."}] if system else []
    return m + [{"role": "user", "content": q}, {"role": "assistant", "content": a}]


CASES = {
    "text": ([{"text": f"Q: {q} A: {a}"} for q, a in QA] + [{"text": "already ends<|im_end|>"}], {}),
    "prompt_completion": ([{"prompt": f"Q: {q} A:", "completion": f" {a}"} for q, a in QA], {}),
    "prompt_completion_full_loss": ([{"prompt": f"Q: {q} A:", "completion": f" {a}"} for q, a in QA],
                                    {"completion_only_loss": False}),
    "messages": ([{"messages": messages(q, a, i % 2 == 0)} for i, (q, a) in enumerate(QA)], {}),
    "messages_assistant_only": (
        [{"messages": messages(q, a, i % 2 == 0) + [{"role": "user", "content": "Thanks"},
                                                    {"role": "assistant", "content": "Welcome."}]}
         for i, (q, a) in enumerate(QA)], {"assistant_only_loss": True, "chat_template_path": TRAINING_TEMPLATE}),
    "conversational_prompt_completion": (
        [{"prompt": [{"role": "user", "content": q}], "completion": [{"role": "assistant", "content": a}]}
         for q, a in QA], {}),
    "sharegpt": ([{"conversations": [{"from": "user", "value": q}, {"from": "assistant", "value": a}]} for q, a in QA],
                 {}),
    # some rows keep part of their completion, some lose all of it and are dropped
    "truncated_keep_start": ([{"prompt": f"Q: {q} " * (1 + i % 3) + "A:", "completion": f" {a}"}
                              for i, (q, a) in enumerate(QA)], {"max_length": 23}),
    "truncated_keep_end": ([{"text": f"Q: {q} " * (1 + i % 3) + f"A: {a}"} for i, (q, a) in enumerate(QA)],
                           {"max_length": 10, "truncation_mode": "keep_end"}),
}


def prepare(rows, options):
    tok = AutoTokenizer.from_pretrained(TOK)
    model = AutoModelForCausalLM.from_pretrained(MODEL)
    with tempfile.TemporaryDirectory() as tmp:
        args = SFTConfig(output_dir=tmp, report_to=[], use_cpu=True, bf16=False, max_length=options.get("max_length", 1024),
                         truncation_mode=options.get("truncation_mode", "keep_start"),
                         completion_only_loss=options.get("completion_only_loss"),
                         assistant_only_loss=options.get("assistant_only_loss", False),
                         chat_template_path=options.get("chat_template_path"), dataset_num_proc=None)
        trainer = SFTTrainer(model=model, args=args, train_dataset=Dataset.from_list(rows), processing_class=tok)
        return [{"input_ids": list(r["input_ids"]), "trained": [int(x != -100) for x in r["labels"]]}
                for r in trainer.train_dataset]


def main():
    os.makedirs(OUT, exist_ok=True)
    for name, (rows, options) in CASES.items():
        with open(os.path.join(OUT, name + ".jsonl"), "w", encoding="utf-8") as f:
            for r in rows:
                f.write(json.dumps(r, ensure_ascii=False) + "\n")
        expected = prepare(rows, options)
        with open(os.path.join(OUT, name + ".expected.jsonl"), "w", encoding="utf-8") as f:
            for r in expected:
                f.write(json.dumps(r) + "\n")
        ini = {k: v for k, v in options.items() if k != "chat_template_path"}
        if "chat_template_path" in options:
            ini["chat_template_path"] = "templates/" + os.path.basename(options["chat_template_path"])
        with open(os.path.join(OUT, name + ".options.json"), "w", encoding="utf-8") as f:
            json.dump(ini, f)
        print(name, len(expected), "rows")
    # The same rows as one JSON array file (read element by element).
    with open(os.path.join(OUT, "messages_array.json"), "w", encoding="utf-8") as f:
        json.dump(CASES["messages"][0], f, ensure_ascii=False, indent=1)


if __name__ == "__main__":
    main()
