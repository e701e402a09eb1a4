/* Where each token of an encoding sits in the text: what chat templates need to turn the byte spans
 * of `{% generation %}` blocks into assistant token masks (transformers' char_to_token). */
#ifndef CTRL_CORE_TOKEN_OFFSETS_H
#define CTRL_CORE_TOKEN_OFFSETS_H

#include <stddef.h>
#include <stdint.h>

#include <ctrl/status.h>

#include "tokenizer/tokenizer.h"

/* starts[k] = byte offset of token k in the normalized text that `ids` encode (n + 1 entries: the
 * last is the total length). CTRL_ERR_UNSUPPORTED for tokenizers whose tokens do not map back to
 * bytes one to one (only byte-level BPE is supported). */
ctrl_status ctrl_tokenizer_token_starts(const ctrl_tokenizer *tok, const int32_t *ids, size_t n,
                                        size_t *starts);
/* The offset in the normalized text of byte `at` of the original `text` (identity without a
 * normalizer; NFC of the prefix otherwise). */
size_t ctrl_tokenizer_normalized_offset(const ctrl_tokenizer *tok, const char *text, size_t at);

#endif
