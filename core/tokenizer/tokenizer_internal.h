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
/* 1 when s[0..n) is well-formed UTF-8. */
int tok_utf8_valid(const char *s, size_t n);
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

/* (id, id) -> int32 map for merge pairs; sized once for `expected` entries (half full at most). */
typedef struct tok_pair_map {
    uint64_t *keys;
    int32_t *values;
    size_t cap;
    int bits;
} tok_pair_map;
int tok_pairs_init(tok_pair_map *m, size_t expected); /* 0 ok, -1 no memory */
void tok_pairs_free(tok_pair_map *m);
void tok_pairs_put(tok_pair_map *m, int32_t a, int32_t b, int32_t value);
int32_t tok_pairs_get(const tok_pair_map *m, int32_t a, int32_t b); /* -1 when absent */

typedef struct tok_added {
    char *content;
    size_t len;
    char *norm_content; /* normalized=true tokens of SentencePiece-style models: matched in the
                           normalized text, as this normalized form */
    size_t norm_len;
    int32_t id;
    int special, lstrip, rstrip, normalized, single_word;
} tok_added;

struct ctrl_tokenizer {
    char *path;
    /* the model */
    tok_map vocab;
    char **id_to_token; /* by id: id_cap slots (vocabulary and added tokens), ids below n_ids used */
    int32_t n_ids, id_cap;
    tok_pair_map merges;   /* (idA, idB) -> rank */
    int32_t *merge_result; /* by rank: the merged token's id */
    /* (last character of a, first character of b) of every merge (a, b), as one-character token
     * ids: only such neighbours can ever end up in one token, so a long word may be cut between
     * any others (can_cut: every merge is of characters, not of unk or byte tokens) */
    tok_pair_map joinable;
    int can_cut;
    int ignore_merges;
    /* pipeline */
    int nfc;           /* an NFC normalizer is among norm_ops */
    pcre2_code *split; /* NULL: no Split pre-tokenizer */
    int byte_level;
    tok_added *added;
    int n_added;
    uint8_t added_first[2][256]; /* [normalized]: 1 where some added token starts with that byte */
    int n_norm_added;            /* added tokens with norm_content */
    int32_t bos_id, eos_id, pad_id;
    int add_bos; /* the post-processor prepends bos on add_special_tokens */
    char *chat_template;
    /* Normalizers in file order (NFC, Prepend, Replace with a literal pattern). */
    struct tok_norm_op {
        int kind; /* TOK_NORM_* */
        char *a, *b;
    } norm_ops[8];
    int n_norm_ops;
    /* SentencePiece-style BPE (Llama-2, Mistral): no byte-level mapping; characters missing from
     * the vocabulary become <0xXX> byte tokens (byte_fallback) or unk (runs fused with fuse_unk), or
     * vanish when there is neither, as in `tokenizers`. */
    int byte_fallback, fuse_unk, unk_missing; /* unk_missing: unk_token names no vocabulary entry */
    int32_t unk_id, byte_id[256];
    /* the Metaspace pre-tokenizer: spaces -> meta (U+2581), prepended per meta_prepend, split
     * before each meta when meta_split */
    int metaspace, meta_prepend, meta_split;
    char meta[5];
    /* decoders other than ByteLevel: a chain applied to the token strings (sp_decode.c) */
    int decoder_chain;
    struct tok_dec_op {
        int kind; /* TOK_DEC_* */
        char *a, *b;
        int start, stop;
    } dec_ops[8];
    int n_dec_ops;
    /* byte-level alphabet: byte -> UTF-8 of its mapped character, and back */
    char byte_char[256][3];
    uint8_t byte_char_len[256];
};

enum { TOK_NORM_NFC = 1, TOK_NORM_PREPEND, TOK_NORM_REPLACE };
enum { TOK_META_NEVER = 0, TOK_META_FIRST, TOK_META_ALWAYS };
enum { TOK_DEC_REPLACE = 1, TOK_DEC_BYTE_FALLBACK, TOK_DEC_FUSE, TOK_DEC_STRIP, TOK_DEC_METASPACE };

/* The normalizers applied to s (malloc'd, NUL-terminated; NULL when out of memory). */
char *tok_normalize(const ctrl_tokenizer *t, const char *s, size_t n, size_t *out_n);

/* The leftmost, longest added token at or after `from` (start and end include lstrip/rstrip
 * whitespace): with `normalized` 0 among the tokens matched in the raw text, with 1 among the
 * normalized=true tokens of a SentencePiece-style model (in normalized text). -1 when none. */
int tok_find_added(const ctrl_tokenizer *t, const char *s, size_t n, size_t from, int normalized,
                   size_t *start, size_t *end);

/* Long encodes stop when interruption is requested (core/interrupt.h): called once per pre-token
 * with the encode's count, it polls every TOK_POLL_PIECES of them (so a text of fewer always
 * finishes) and returns CTRL_ERR_INTERRUPTED then, else CTRL_OK. BPE of one long pre-token polls
 * every TOK_POLL_MERGES merges. */
enum { TOK_POLL_PIECES = 4096, TOK_POLL_MERGES = 1 << 16 };
ctrl_status tok_poll(size_t *pieces);
ctrl_status tok_interrupted(void); /* sets the message, returns CTRL_ERR_INTERRUPTED */

/* One segment of text between raw-matched added tokens of a SentencePiece-style model: normalize,
 * split out normalized added tokens, Metaspace, BPE. `at_start`: the segment begins the text;
 * `pieces`: the encode's pre-token count (tok_poll). */
ctrl_status tok_encode_sp(const ctrl_tokenizer *t, const char *s, size_t n, int at_start, int32_t **ids,
                          size_t *n_ids, size_t *cap, size_t *pieces);

/* Ids from tokenizer.json, validated where they are read (tokenizer_ids.c): model.vocab (sizes
 * id_to_token for it and n_added added tokens), added_tokens, a TemplateProcessing token's id. */
struct cJSON;
enum { TOK_MAX_IDS = 1 << 24 }; /* vocabulary ids are below this (the largest vocabularies: ~256k) */
/* o[key] as a string (NULL when absent or not a string), as a bool (fallback when not one). */
const char *tok_json_str(const struct cJSON *o, const char *key);
int tok_json_bool(const struct cJSON *o, const char *key, int fallback);
ctrl_status tok_load_vocab(ctrl_tokenizer *t, const struct cJSON *vocab, int n_added);
ctrl_status tok_load_added(ctrl_tokenizer *t, const struct cJSON *list);
ctrl_status tok_template_token(const ctrl_tokenizer *t, const struct cJSON *p, const char *name, int32_t *id);

/* Loading and applying decoders other than ByteLevel (decode_chain.c). */
struct cJSON;
ctrl_status tok_load_decoder_chain(ctrl_tokenizer *t, const struct cJSON *d);
/* Metaspace's settings (pre-tokenizer or decoder): prepend scheme (TOK_META_*), split, the
 * replacement character as UTF-8. */
ctrl_status tok_load_meta(const ctrl_tokenizer *t, const struct cJSON *p, int *scheme, int *split,
                          char meta[5]);
ctrl_status tok_decode_chain(const ctrl_tokenizer *t, const int32_t *ids, size_t n, int skip_special,
                             char **text, size_t *len);
int tok_is_special(const ctrl_tokenizer *t, int32_t id);

/* BPE of one pre-token (already byte-level mapped, or normalized for SentencePiece-style models):
 * appends ids; a character missing from the vocabulary becomes byte tokens (byte_fallback) or unk
 * or nothing; returns 0, -1 on a byte-level character missing (a malformed tokenizer) or no memory,
 * -2 when unk is needed but unk_token is not in the vocabulary, -3 when interrupted (tok_poll). */
int tok_bpe(const ctrl_tokenizer *t, const char *word, size_t len, int32_t **ids, size_t *n, size_t *cap);
/* Fills joinable and can_cut (after the vocabulary, merges, unk and byte tokens are known). */
ctrl_status tok_index_joinable(ctrl_tokenizer *t);

#endif
