/* One dataset row to a tokenized SFT example with TRL's semantics: `text` rows and string
 * `prompt` + `completion` (EOS text appended when missing, the completion starting where the
 * tokenized prompt and prompt+completion diverge), conversational `messages`, `prompt` +
 * `completion` message lists and ShareGPT `conversations` (chat template, assistant masks from
 * `{% generation %}`), and pre-tokenized `input_ids` (with optional -100 `labels`). */
#ifndef CTRL_CORE_SFT_FORMAT_H
#define CTRL_CORE_SFT_FORMAT_H

#include <cJSON.h>
#include <stdint.h>

#include <ctrl/config.h>

#include "tokenizer/tokenizer.h"

typedef struct ctrl_sft_format ctrl_sft_format;

/* Reads [data] dataset_text_field, messages_field, prompt_field, completion_field,
 * completion_only_loss, assistant_only_loss and chat_template_path. */
ctrl_status ctrl_sft_format_create(const ctrl_tokenizer *tok, const ctrl_config *cfg, ctrl_sft_format **out);
void ctrl_sft_format_free(ctrl_sft_format *f);
/* Tokenizes `row` into malloc'd ids and per-token trained flags. A malformed row sets *why (a
 * static description) and returns CTRL_OK; errors that no row can fix (no chat template, a template
 * error, assistant_only_loss with no assistant token) return a status. */
ctrl_status ctrl_sft_format_row(ctrl_sft_format *f, cJSON *row, int32_t **ids, uint8_t **trained, int *n,
                                const char **why);

#endif
