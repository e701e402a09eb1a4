#!/usr/bin/env python3
"""Tokenizer fixtures from the `tokenizers` library:
- corpus.jsonl: >= 2000 lines mixing English, Chinese, code, emoji, numbers, accents (composed
  and decomposed, for NFC), contractions, whitespace runs, newlines and special-token text;
- <name>.ids: for each corpus line, the ids of encode(text, add_special_tokens=False), then a
  tab, then the ids with add_special_tokens=True;
- <name>.decoded.jsonl: decode(ids) of each line, skip_special_tokens False and True;
for the real qwen3, llama3 and llama2 (SentencePiece-style BPE with byte fallback) tokenizers
(../shared/data/tokenizers), a tiny byte-level BPE trained here (tiny_bpe/, with ChatML special
tokens and chat template, for the quickstart) and a tiny SentencePiece-style BPE trained here
(tiny_sp/: Llama-2's normalizer, decoder and byte fallback, a small alphabet so that Chinese and
emoji go through the byte tokens).
Run by hand: python3 tests/reference/make_tokenizer_fixtures.py [NAME...] (default: all)
"""
import glob
import json
import os
import random
import sysconfig

import tokenizers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "fixtures", "tokenizer")
SHARED = os.path.join(HERE, "..", "..", "..", "shared", "data", "tokenizers")

ENGLISH = ["The quick brown fox jumps over the lazy dog.", "I'll be there; you're late, aren't you?",
           "DON'T SHOUT! We've SEEN it.", "Prices rose 3.5% to $1,234.56 in Q3 2024.", "e-mail: someone@example.com",
           "Hello,   world!!!", "New\nline and\r\nwindows line", "tabs\tand\t\tmore tabs", "   leading and trailing   "]
CHINESE = ["你好，世界！", "机器学习是人工智能的一个分支。", "今天天气很好，我们去公园散步吧。", "数学：3加4等于7。",
           "中文English混合text测试", "这是一个“引号”测试…"]
EMOJI = ["🎉🎉 party", "I ❤️ tokenizers", "👩‍👩‍👧‍👦 family", "🚀 to the 🌕", "flags 🇫🇷🇯🇵", "smile 😀😃😄"]
ACCENTS = ["café naïve résumé", "cafe\u0301 (decomposed e + acute)", "Ångström", "A\u030a (decomposed)",
           "crème brûlée", "Ω ohm sign \u2126", "ﬁ ligature", "한국어 텍스트", "\u1100\u1161 jamo"]
SPECIAL = ["<|im_start|>user\nHi<|im_end|>", "<|endoftext|>", "text<|im_end|>more", "<think>\nok\n</think>"]


def corpus():
    rng = random.Random(1234)
    lines = ENGLISH + CHINESE + EMOJI + ACCENTS + SPECIAL
    src = sorted(glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "*.py")))[:40]
    code = []
    for path in src:
        with open(path, encoding="utf-8", errors="replace") as f:
            code += [l.rstrip("\n") for l in f if l.strip()][:60]
    rng.shuffle(code)
    lines += code[:1400]
    pools = [ENGLISH, CHINESE, EMOJI, ACCENTS, code[:200]]
    while len(lines) < 2200:
        k = rng.randint(1, 4)
        parts = [rng.choice(rng.choice(pools)) for _ in range(k)]
        sep = rng.choice([" ", "  ", "\n", "\t", "", " \n ", "    ", "\r\n"])
        s = sep.join(parts)
        if rng.random() < 0.2:
            s += " " + str(rng.randint(0, 10**rng.randint(1, 12)))
        if rng.random() < 0.1:
            s = " " * rng.randint(1, 9) + s
        lines.append(s)
    return lines


def write_ids(name, tok, lines):
    with open(os.path.join(OUT, name + ".ids"), "w") as f:
        for line in lines:
            a = tok.encode(line, add_special_tokens=False).ids
            b = tok.encode(line, add_special_tokens=True).ids
            f.write(" ".join(map(str, a)) + "\t" + " ".join(map(str, b)) + "\n")
    with open(os.path.join(OUT, name + ".decoded.jsonl"), "w") as f:
        for line in lines:
            ids = tok.encode(line, add_special_tokens=True).ids
            f.write(json.dumps({"keep": tok.decode(ids, skip_special_tokens=False),
                                "skip": tok.decode(ids, skip_special_tokens=True)}, ensure_ascii=False) + "\n")


CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
          "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def tiny(lines):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1024, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(lines, trainer)
    d = os.path.join(OUT, "tiny_bpe")
    os.makedirs(d, exist_ok=True)
    tok.save(os.path.join(d, "tokenizer.json"))
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": None, "eos_token": "<|im_end|>",
                   "pad_token": "<|endoftext|>", "chat_template": CHATML, "model_max_length": 2048}, f, indent=2)
    return tok


def tiny_sp(lines):
    """A SentencePiece-style BPE as Llama-2's tokenizer.json describes one: <unk> <s> </s>, then the
    256 byte tokens <0x00>..<0xFF>, then the trained pieces; no pre-tokenizer."""
    from tokenizers import normalizers, processors
    tok = Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    trainer = trainers.BpeTrainer(vocab_size=700, special_tokens=["<unk>", "<s>", "</s>"], limit_alphabet=90,
                                  show_progress=False)
    tok.train_from_iterator(lines, trainer)
    spec = json.loads(tok.to_str())
    vocab = spec["model"]["vocab"]
    pieces = sorted((i, t) for t, i in vocab.items() if t not in ("<unk>", "<s>", "</s>"))
    new = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        new["<0x%02X>" % b] = 3 + b
    for _, t in pieces:
        new.setdefault(t, len(new))
    spec["model"]["vocab"] = new
    for a in spec["added_tokens"]:
        a["id"] = new[a["content"]]
    spec["decoder"] = json.loads(decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                                    decoders.Fuse(), decoders.Strip(" ", 1, 0)]).__getstate__())
    spec["post_processor"] = json.loads(processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)]).__getstate__())
    d = os.path.join(OUT, "tiny_sp")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "tokenizer.json"), "w") as f:
        json.dump(spec, f, ensure_ascii=False)
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "LlamaTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
                   "unk_token": "<unk>", "add_bos_token": True}, f, indent=2)
    return Tokenizer.from_file(os.path.join(d, "tokenizer.json"))


META = "\u2581"
STRIP_DECODER = {"type": "Sequence", "decoders": [
    {"type": "Replace", "pattern": {"String": META}, "content": " "}, {"type": "ByteFallback"}, {"type": "Fuse"},
    {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
# Variants of tiny_sp for the configurations Llama-2's file does not use; the C test applies the
# same edits to tiny_sp/tokenizer.json: "set" replaces top-level keys, "model_set" keys of the model,
# "vocab_remove" drops vocabulary entries, "added_append" adds added tokens.
SP_VARIANTS = [
    ("metaspace_first", {"set": {"normalizer": None, "pre_tokenizer": {
        "type": "Metaspace", "replacement": META, "prepend_scheme": "first", "split": False}}}),
    ("metaspace_legacy", {"set": {"normalizer": None, "pre_tokenizer": {
        "type": "Metaspace", "replacement": META, "add_prefix_space": True, "str_rep": META},
        "decoder": {"type": "Metaspace", "replacement": META, "add_prefix_space": True}}}),
    ("metaspace_never", {"set": {"normalizer": None, "pre_tokenizer": {
        "type": "Metaspace", "replacement": META, "prepend_scheme": "never", "split": True},
        "decoder": {"type": "Metaspace", "replacement": META, "prepend_scheme": "never", "split": True}}}),
    ("unk_unfused", {"model_set": {"byte_fallback": False, "fuse_unk": False}}),
    ("unk_fused", {"model_set": {"byte_fallback": False, "fuse_unk": True}}),
    ("bytes_partial", {"vocab_remove": ["<0x%02X>" % b for b in (0x80, 0x9F, 0xE4, 0xF0)]}),
    ("bytes_partial_no_unk", {"model_set": {"unk_token": None},
                              "vocab_remove": ["<0x%02X>" % b for b in (0x80, 0x9F, 0xE4, 0xF0)]}),
    ("ignore_merges", {"model_set": {"ignore_merges": True}}),
    ("no_decoder", {"set": {"decoder": None}}),
    ("decoder_parts", {"set": {"decoder": {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": META}, "content": " "}, {"type": "ByteFallback"},
        {"type": "Strip", "content": " ", "start": 2, "stop": 0}]}}}),  # per token; stop > 0 can panic in Rust
    ("nfc_added", {"set": {"normalizer": {"type": "Sequence", "normalizers": [
        {"type": "NFC"}, {"type": "Prepend", "prepend": META},
        {"type": "Replace", "pattern": {"String": " "}, "content": META}]}},
        "added_append": [
            {"id": 956, "content": "w\u00f6rld", "single_word": False, "lstrip": False, "rstrip": False,
             "normalized": True, "special": False},
            {"id": 957, "content": "<mask>", "single_word": False, "lstrip": True, "rstrip": True,
             "normalized": False, "special": True},
            {"id": 958, "content": "is", "single_word": True, "lstrip": False, "rstrip": False,
             "normalized": True, "special": False}]}),
]
SP_CASES = ["", " ", "  ", "a", " a", "a ", "  two  spaces  ", "\u2581literal meta \u2581\u2581x", "tab\there\nnew",
            "<s>", "<s>hello", "hello<s>", "<s> hello </s>", "</s></s><unk>", "x<unk>y", "<s><s>",
            "w\u00f6rld world wo\u0308rld, w\u00f6rld!", "this is his island", "a <mask> b  <mask>c",
            "你好世界 🎉🎉 𝔘𝔫𝔦", "\u00e9\u0301 e\u0301", "ﬁ ℌ \u2126", "\x01\x1f control \x7f", "🇫🇷🇯🇵👩‍👩‍👧‍👦"]


def sp_variant(spec, edit):
    spec = json.loads(json.dumps(spec))
    spec.update(edit.get("set", {}))
    spec["model"].update(edit.get("model_set", {}))
    for t in edit.get("vocab_remove", []):
        del spec["model"]["vocab"][t]
    spec["added_tokens"] += edit.get("added_append", [])
    return Tokenizer.from_str(json.dumps(spec))


def write_sp_variants(lines):
    """tiny_sp_variants.jsonl: per variant, encodings (without and with special tokens) and decodes
    (keeping and skipping special tokens) of a sample of the corpus and the cases above, and decodes
    of random id sequences."""
    with open(os.path.join(OUT, "tiny_sp", "tokenizer.json")) as f:
        spec = json.load(f)
    rng = random.Random(77)
    texts = SP_CASES + lines[::50]
    n_ids = len(spec["model"]["vocab"])
    with open(os.path.join(OUT, "tiny_sp_variants.jsonl"), "w") as f:
        for name, edit in SP_VARIANTS:
            tok = sp_variant(spec, edit)
            if "added_append" in edit:  # the ids the library gives them ("is" normalizes to the vocabulary's "\u2581is")
                added = json.loads(tok.to_str())["added_tokens"]
                edit = {k: v for k, v in edit.items() if k != "added_append"}
                edit["added_append"] = added[len(spec["added_tokens"]):]
            cases = []
            for text in texts:
                a = tok.encode(text, add_special_tokens=False).ids
                b = tok.encode(text, add_special_tokens=True).ids
                cases.append({"text": text, "ids": a, "ids_special": b,
                              "keep": tok.decode(b, skip_special_tokens=False),
                              "skip": tok.decode(b, skip_special_tokens=True)})
            for _ in range(20):  # decoding alone: byte-token runs, specials, meta characters anywhere
                ids = [rng.choice([rng.randrange(n_ids), rng.randrange(3), rng.randrange(3, 259)])
                       for _ in range(rng.randint(1, 12))]
                cases.append({"ids_special": ids, "keep": tok.decode(ids, skip_special_tokens=False),
                              "skip": tok.decode(ids, skip_special_tokens=True)})
            f.write(json.dumps({"name": name, "edit": edit, "cases": cases}, ensure_ascii=False) + "\n")


def main():
    import sys
    names = sys.argv[1:] or ["qwen3", "llama3", "llama2", "tiny_bpe", "tiny_sp"]
    os.makedirs(OUT, exist_ok=True)
    lines = corpus()
    with open(os.path.join(OUT, "corpus.jsonl"), "w") as f:
        f.write(json.dumps({"note": "tokenizers %s (make_tokenizer_fixtures.py)" % tokenizers.__version__}) + "\n")
        for line in lines:
            f.write(json.dumps({"text": line}, ensure_ascii=False) + "\n")
    for name in names:
        if name in ("qwen3", "llama3", "llama2"):
            tok = Tokenizer.from_file(os.path.join(SHARED, name, "tokenizer.json"))
        else:
            tok = tiny(lines) if name == "tiny_bpe" else tiny_sp(lines)
        write_ids(name, tok, lines)
        if name == "tiny_sp":
            write_sp_variants(lines)
    print(len(lines), "lines")


if __name__ == "__main__":
    main()
