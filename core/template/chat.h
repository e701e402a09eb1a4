/* Chat templates as transformers applies them: the variables a template sees (messages with the
 * reasoning aliases, tools, documents, add_generation_prompt, the tokenizer's special tokens),
 * rendering, and tokenizing with the assistant mask from `{% generation %}` blocks. */
#ifndef CTRL_CORE_CHAT_H
#define CTRL_CORE_CHAT_H

#include <cJSON.h>
#include <stddef.h>
#include <stdint.h>

#include "template/template.h"
#include "tokenizer/tokenizer.h"

/* render_jinja_template for one conversation: `vars` holds "messages" and any other variables
 * (add_generation_prompt, enable_thinking, bos_token, ...); tools and documents default to None. */
ctrl_status ctrl_chat_render(const ctrl_template *t, const cJSON *vars, char **text, size_t *len,
                             uint8_t **generation_mask);
/* Adds the tokenizer's bos_token, eos_token and pad_token strings to `vars` where it lacks them. */
void ctrl_chat_add_special_tokens(const ctrl_tokenizer *tok, cJSON *vars);
/* Compiles the tokenizer's chat template (an error naming the tokenizer when it has none). */
ctrl_status ctrl_chat_template_load(const ctrl_tokenizer *tok, ctrl_template **out);
/* apply_chat_template(tokenize=True): render, encode without adding special tokens; with
 * assistant_mask, also the per-token mask of return_assistant_tokens_mask=True. Outputs malloc'd. */
ctrl_status ctrl_chat_encode(const ctrl_tokenizer *tok, const ctrl_template *t, const cJSON *vars,
                             int32_t **ids, size_t *n_ids, uint8_t **assistant_mask);

#endif
