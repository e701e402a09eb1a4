/* Hugging Face tokenizers from tokenizer.json: byte-level BPE (GPT-2 / Qwen2 / Llama-3 style:
 * NFC, Split + ByteLevel pre-tokenizers, ByteLevel decoder) and SentencePiece-style BPE (Llama-2 /
 * Mistral style: Prepend/Replace normalizers or a Metaspace pre-tokenizer, <0xXX> byte fallback and
 * unk, Replace/ByteFallback/Fuse/Strip or Metaspace decoders), with added and special tokens and a
 * BOS post-processor; bit-exact with the `tokenizers` library on the supported configurations.
 * Files are untrusted: anything unsupported or malformed is a clear error naming the file. */
#ifndef CTRL_CORE_TOKENIZER_H
#define CTRL_CORE_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include <ctrl/status.h>

typedef struct ctrl_tokenizer ctrl_tokenizer;

/* `path` is a directory holding tokenizer.json (and optionally tokenizer_config.json) or the
 * tokenizer.json file itself. */
ctrl_status ctrl_tokenizer_load(const char *path, ctrl_tokenizer **out);
void ctrl_tokenizer_free(ctrl_tokenizer *tok);

/* Encodes UTF-8 text; *ids is malloc'd (free it). add_special_tokens applies the post-processor
 * (e.g. a BOS token) as the library's encode(..., add_special_tokens=True) does. Thread-safe. */
ctrl_status ctrl_tokenizer_encode(const ctrl_tokenizer *tok, const char *text, size_t len,
                                  int add_special_tokens, int32_t **ids, size_t *n_ids);
/* Decodes ids to malloc'd UTF-8 text; skip_special_tokens drops special added tokens. */
ctrl_status ctrl_tokenizer_decode(const ctrl_tokenizer *tok, const int32_t *ids, size_t n,
                                  int skip_special_tokens, char **text, size_t *len);

int ctrl_tokenizer_vocab_size(const ctrl_tokenizer *tok);                         /* including added tokens */
int32_t ctrl_tokenizer_token_to_id(const ctrl_tokenizer *tok, const char *token); /* -1 if absent */
const char *ctrl_tokenizer_id_to_token(const ctrl_tokenizer *tok, int32_t id);    /* NULL if absent */
/* From tokenizer_config.json when present (-1 / NULL otherwise). */
int32_t ctrl_tokenizer_bos_id(const ctrl_tokenizer *tok);
int32_t ctrl_tokenizer_eos_id(const ctrl_tokenizer *tok);
int32_t ctrl_tokenizer_pad_id(const ctrl_tokenizer *tok);
const char *ctrl_tokenizer_chat_template(const ctrl_tokenizer *tok);

#endif
