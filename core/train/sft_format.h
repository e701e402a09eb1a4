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

#include "template/template.h"
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

/* Shared with the preference rows (pref_format.c): */
/* The chat template at `path` (a Jinja file), or the tokenizer's when path is NULL. */
ctrl_status ctrl_row_chat_template(const ctrl_tokenizer *tok, const char *path, ctrl_template **out);
/* A conversation's template variables as TRL passes them: messages, the row's tools (a JSON string
 * is parsed) and chat_template_kwargs, add_generation_prompt, the tokenizer's special tokens. */
cJSON *ctrl_row_chat_vars(const ctrl_tokenizer *tok, const cJSON *row, const cJSON *messages, int add_gen);
/* 1 for a non-empty list of objects that all have a string "role". */
int ctrl_row_messages_ok(const cJSON *m);
/* Leading tokens a and b have in common (TRL's common_prefix_length). */
size_t ctrl_common_prefix(const int32_t *a, size_t na, const int32_t *b, size_t nb);

#endif
