/* Shared by the tokenizer's files: UTF-8 helpers, a string->id hash map, the loaded model. */
#ifndef CTRL_CORE_TOKENIZER_INTERNAL_H
#define CTRL_CORE_TOKENIZER_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "tokenizer/tokenizer.h"

/* Decodes one code point at s[*i] (advancing *i); invalid bytes decode as U+FFFD, one byte each. */
uint32_t tok_utf8_decode(const char *s, size_t n, size_t *i);
/* Writes cp as UTF-8 into out (at most 4 bytes); returns the byte count. */
size_t tok_utf8_encode(uint32_t cp, char *out);
/* NFC of UTF-8 text (malloc'd, NUL-terminated). */
char *tok_nfc(const char *s, size_t n, size_t *out_n);

/* Open-addressing map from byte strings to int32 (vocabulary, merge pairs). */
typedef struct tok_map {
    char **keys;
    size_t *key_lens;
    int32_t *values;
    size_t cap, count;
} tok_map;
int tok_map_init(tok_map *m, size_t expected);
void tok_map_free(tok_map *m);
int tok_map_put(tok_map *m, const char *key, size_t len, int32_t value); /* 0 ok, -1 no memory */
int32_t tok_map_get(const tok_map *m, const char *key, size_t len);      /* -1 when absent */

typedef struct tok_added {
    char *content;
    size_t len;
    int32_t id;
    int special, lstrip, rstrip, normalized, single_word;
} tok_added;

struct ctrl_tokenizer {
    char *path;
    /* the model */
    tok_map vocab;
    char **id_to_token; /* by id */
    int32_t n_ids;
    tok_map merges;        /* "idA idB" as 8 bytes -> rank */
    int32_t *merge_result; /* by rank: the merged token's id */
    int ignore_merges;
    /* pipeline */
    int nfc;
    pcre2_code *split; /* NULL: no Split pre-tokenizer */
    int byte_level;
    tok_added *added;
    int n_added;
    uint8_t added_first[256]; /* 1 where some added token starts with that byte */
    int32_t bos_id, eos_id, pad_id;
    int add_bos; /* the post-processor prepends bos on add_special_tokens */
    char *chat_template;
    /* SentencePiece-style BPE (Llama-2, Mistral): no pre-tokenizer; Prepend / Replace normalizers in
     * file order; characters missing from the vocabulary become <0xXX> byte tokens (byte_fallback)
     * or <unk> (runs fused with fuse_unk); decoder Replace("\u2581", " ") + ByteFallback + Fuse +
     * Strip(" ", strip_start). */
    struct tok_norm_op {
        int kind; /* 1 prepend a, 2 replace a by b */
        char *a, *b;
    } norm_ops[4];
    int n_norm_ops;
    int byte_fallback, fuse_unk, sp_decoder, strip_start;
    int32_t unk_id, byte_id[256];
    /* byte-level alphabet: byte -> UTF-8 of its mapped character, and back */
    char byte_char[256][3];
    uint8_t byte_char_len[256];
};

/* BPE of one pre-token (already byte-level mapped, or normalized for SentencePiece-style models):
 * appends ids; a character missing from the vocabulary becomes byte tokens (byte_fallback) or unk;
 * returns 0, -1 when neither can stand for it (a malformed tokenizer). */
int tok_bpe(const ctrl_tokenizer *t, const char *word, size_t len, int32_t **ids, size_t *n, size_t *cap);

#endif
