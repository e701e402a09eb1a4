#!/usr/bin/env python3
"""Sequence-classification (reward model) fixtures from transformers itself.

Writes tests/fixtures/score/<arch>/ for a tiny random Qwen2ForSequenceClassification (tied
embeddings, q/k/v biases, the vocabulary of the committed tiny_bpe tokenizer) and
LlamaForSequenceClassification (num_labels = 1, pad_token_id set, float32, eager attention):
  config.json, model.safetensors   the model as save_pretrained writes it
  batch.json                       a right-padded batch (one row ending in attended pad tokens,
                                   the eos == pad case TRL's appended eos makes), each row's
                                   attended tokens, the scores transformers returns (the rightmost
                                   non-pad token's), the weights w of the loss sum(w * score)
  grads.safetensors                d(sum(w * score))/d(every parameter)
  reward_plugin.json (qwen2)       prompt/completion texts, tokenized as GRPOTrainer tokenizes for
                                   a reward model (p + c, add_special_tokens=False, right padding),
                                   and the scores
Run by hand: /work/venv/bin/python tests/reference/make_score_fixtures.py
"""
import json
import os
import sys

import torch
import transformers
from fixture_io import randomize_params
from safetensors.torch import save_file
from transformers import (AutoTokenizer, LlamaConfig, LlamaForSequenceClassification, Qwen2Config,
                          Qwen2ForSequenceClassification)

HERE = os.path.dirname(os.path.abspath(__file__))
FIX = os.path.join(HERE, "..", "fixtures")
OUT = os.path.join(FIX, "score")
TOK = os.path.join(FIX, "tokenizer", "tiny_bpe")
COMMON = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, head_dim=8, max_position_embeddings=256, rms_norm_eps=1e-6,
              num_labels=1, pad_token_id=0)
ARCHS = {
    "qwen2": (Qwen2Config, Qwen2ForSequenceClassification, dict(vocab_size=1024, tie_word_embeddings=True)),
    "llama": (LlamaConfig, LlamaForSequenceClassification, dict(vocab_size=128, tie_word_embeddings=False)),
}
LENGTHS = [7, 12, 5, 9]
NOTE = "torch %s, transformers %s (make_score_fixtures.py)" % (torch.__version__, transformers.__version__)


def padded_batch(vocab, pad):
    rows = []
    for i, L in enumerate(LENGTHS):
        seq = torch.randint(1, vocab, (L,))
        if i == 3:  # ends in two attended pad tokens: the score is read before them
            seq[-2:] = pad
        rows.append(seq)
    T = max(LENGTHS)
    ids = torch.full((len(rows), T), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), T), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = r
        mask[i, : len(r)] = 1
    return rows, ids, mask


def main():
    for arch, (Cfg, Cls, extra) in ARCHS.items():
        torch.manual_seed(2000 + len(arch))
        cfg = Cfg(**COMMON, **extra)
        cfg._attn_implementation = "eager"
        model = Cls(cfg).float()
        randomize_params(model, torch)
        model.eval()
        d = os.path.join(OUT, arch)
        os.makedirs(d, exist_ok=True)
        model.save_pretrained(d, safe_serialization=True)
        rows, ids, mask = padded_batch(cfg.vocab_size, cfg.pad_token_id)
        scores = model(input_ids=ids, attention_mask=mask).logits[:, 0]
        w = torch.randn(len(rows))
        (w * scores).sum().backward()
        grads = {n: p.grad.detach().contiguous() for n, p in model.named_parameters()}
        save_file(grads, os.path.join(d, "grads.safetensors"))
        with open(os.path.join(d, "batch.json"), "w") as f:
            json.dump({"rows": [r.tolist() for r in rows], "scores": scores.tolist(), "w": w.tolist(),
                       "note": NOTE}, f)
        print(arch, "scores", [round(s, 6) for s in scores.tolist()])
        if arch == "qwen2":
            plugin_fixture(model, d)


def plugin_fixture(model, d):
    tok = AutoTokenizer.from_pretrained(TOK)
    prompts = ["What is 2+3?", "What is 7+5?", "Say hi.", "What is 10+11?"]
    completions = [" 5", " 13", " hi there, friend", " 21<|im_end|>"]
    texts = [p + c for p, c in zip(prompts, completions)]
    enc = tok(text=texts, return_tensors="pt", padding=True, padding_side="right", add_special_tokens=False)
    with torch.no_grad():
        scores = model(**enc).logits[:, 0]
    with open(os.path.join(d, "reward_plugin.json"), "w") as f:
        json.dump({"prompts": prompts, "completions": completions, "scores": scores.tolist(), "note": NOTE}, f)
    print("plugin scores", scores.tolist())


def chat_fixture(d):
    """Conversational prompts as TRL's GRPOTrainer scores them with a reward model: each prompt's
    messages plus the completion as the assistant's message, through trl.data_utils.apply_chat_template
    with the reward model's tokenizer (its chat template; the end-of-turn after the completion), then
    tokenized without special tokens, right-padded: reward_plugin_chat.json (messages, completions,
    the texts TRL built, the scores). Reads the model saved in `d`."""
    from transformers import AutoModelForSequenceClassification
    from trl.data_utils import apply_chat_template
    tok = AutoTokenizer.from_pretrained(TOK)
    model = AutoModelForSequenceClassification.from_pretrained(d, dtype=torch.float32, attn_implementation="eager")
    model.eval()
    prompts = [[{"role": "user", "content": "What is 2+3?"}],
               [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "What is 7+5?"}],
               [{"role": "user", "content": "Say hi."}],
               [{"role": "user", "content": "What is 10+11?"}]]
    completions = ["5", "13", "hi there, friend", "21"]
    texts = [apply_chat_template({"messages": p + [{"role": "assistant", "content": c}]}, tok)["text"]
             for p, c in zip(prompts, completions)]
    enc = tok(text=texts, return_tensors="pt", padding=True, padding_side="right", add_special_tokens=False)
    with torch.no_grad():
        scores = model(**enc).logits[:, 0]
    with open(os.path.join(d, "reward_plugin_chat.json"), "w") as f:
        json.dump({"messages": prompts, "completions": completions, "texts": texts, "scores": scores.tolist(),
                   "note": NOTE}, f)
    print("plugin chat scores", scores.tolist())


if __name__ == "__main__":
    if sys.argv[1:] == ["chat"]:  # only reward_plugin_chat.json, from the committed qwen2 classifier
        chat_fixture(os.path.join(OUT, "qwen2"))
    else:
        main()
        chat_fixture(os.path.join(OUT, "qwen2"))
