/* Encoding and decoding arbitrary bytes with the fixture tokenizers, loaded once: a byte-level BPE
 * (Qwen2 style) and a SentencePiece-style BPE (Llama-2 style). The first byte picks the tokenizer;
 * the rest is the text, and also read as token ids to decode (out-of-range ids decode to nothing). */
#include <stdlib.h>
#include <string.h>

#include "fuzz_common.h"
#include "tokenizer/tokenizer.h"

static ctrl_tokenizer *toks[2];

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    fuzz_quiet();
    const char *dirs[2] = {CTRL_FIXTURE_DIR "/tokenizer/tiny_bpe", CTRL_FIXTURE_DIR "/tokenizer/tiny_sp"};
    for (int i = 0; i < 2; i++)
        if (ctrl_tokenizer_load(dirs[i], &toks[i]) != CTRL_OK) abort();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    const ctrl_tokenizer *tok = toks[data[0] & 1];
    const char *text = (const char *)data + 1;
    const size_t len = size - 1;
    for (int special = 0; special < 2; special++) {
        int32_t *ids = NULL;
        size_t n = 0;
        if (ctrl_tokenizer_encode(tok, text, len, special, &ids, &n) != CTRL_OK) continue;
        for (int skip = 0; skip < 2; skip++) {
            char *out = NULL;
            size_t out_len = 0;
            if (ctrl_tokenizer_decode(tok, ids, n, skip, &out, &out_len) != CTRL_OK) abort();
            free(out);
        }
        free(ids);
    }
    /* The bytes as ids: mostly out of range, which decode must skip without reading past the vocabulary. */
    const size_t n_ids = len / sizeof(int32_t);
    int32_t *ids = malloc((n_ids ? n_ids : 1) * sizeof *ids);
    if (!ids) abort();
    memcpy(ids, text, n_ids * sizeof *ids);
    for (size_t i = 0; i < n_ids && data[0] & 2; i++) /* half the time: ids folded into the vocabulary */
        ids[i] = (int32_t)((uint32_t)ids[i] % (uint32_t)ctrl_tokenizer_vocab_size(tok));
    char *out = NULL;
    size_t out_len = 0;
    if (ctrl_tokenizer_decode(tok, ids, n_ids, data[0] >> 2 & 1, &out, &out_len) == CTRL_OK) free(out);
    free(ids);
    return 0;
}
