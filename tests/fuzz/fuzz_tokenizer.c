/* tokenizer.json (+ tokenizer_config.json) loaded from a scratch directory, then the third part of
 * the input encoded and decoded with it; the chat template it names is compiled. Input:
 * tokenizer.json FUZZ_SEPARATOR tokenizer_config.json FUZZ_SEPARATOR text (docs/fuzzing.md). */
#include <stdlib.h>
#include <string.h>

#include "fuzz_common.h"
#include "template/chat.h"
#include "tokenizer/tokenizer.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    fuzz_quiet();
    return 0;
}

/* Encode and decode `text` both ways; decoding the ids just made must succeed. */
static void round_trip(const ctrl_tokenizer *tok, fuzz_part text) {
    for (int special = 0; special < 2; special++) {
        int32_t *ids = NULL;
        size_t n = 0;
        if (ctrl_tokenizer_encode(tok, (const char *)text.data, text.size, special, &ids, &n) != CTRL_OK)
            continue;
        for (int skip = 0; skip < 2; skip++) {
            char *out = NULL;
            size_t len = 0;
            if (ctrl_tokenizer_decode(tok, ids, n, skip, &out, &len) != CTRL_OK) abort();
            if (strlen(out) > len) abort(); /* NUL-terminated at len (decoded text may hold NULs) */
            free(out);
        }
        for (size_t i = 0; i < n; i++) (void)ctrl_tokenizer_id_to_token(tok, ids[i]);
        free(ids);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_part part[3];
    fuzz_split(data, size, part, 3);
    fuzz_scratch_put("tokenizer.json", part[0].data, part[0].size);
    fuzz_scratch_put("tokenizer_config.json", part[1].data, part[1].size ? part[1].size : (size_t)-1);
    ctrl_tokenizer *tok = NULL;
    if (ctrl_tokenizer_load(fuzz_scratch_dir(), &tok) != CTRL_OK) return 0;
    round_trip(tok, part[2]);
    (void)ctrl_tokenizer_id_to_token(tok, ctrl_tokenizer_vocab_size(tok));
    (void)ctrl_tokenizer_id_to_token(tok, -1);
    const int32_t special[3] = {ctrl_tokenizer_bos_id(tok), ctrl_tokenizer_eos_id(tok),
                                ctrl_tokenizer_pad_id(tok)};
    for (int i = 0; i < 3; i++)
        if (special[i] >= ctrl_tokenizer_vocab_size(tok)) abort(); /* -1 or a real id */
    ctrl_template *tpl = NULL;
    if (ctrl_tokenizer_chat_template(tok) && ctrl_chat_template_load(tok, &tpl) == CTRL_OK)
        ctrl_template_free(tpl);
    ctrl_tokenizer_free(tok);
    return 0;
}
