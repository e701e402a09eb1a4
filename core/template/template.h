/* Jinja chat templates: a compiled template renders a JSON object of variables (messages,
 * add_generation_prompt, bos_token, ...) to text exactly as transformers' apply_chat_template does,
 * with a per-byte mask of what `{% generation %}` blocks wrote (the assistant mask). Templates are
 * untrusted input: anything outside the supported subset is a clear error, never a crash. */
#ifndef CTRL_CORE_TEMPLATE_H
#define CTRL_CORE_TEMPLATE_H

#include <cJSON.h>
#include <stddef.h>
#include <stdint.h>

#include <ctrl/status.h>

typedef struct ctrl_template ctrl_template;

/* `origin` names the template in error messages (e.g. "DIR/tokenizer_config.json"). */
ctrl_status ctrl_template_compile(const char *src, size_t len, const char *origin, ctrl_template **out);
void ctrl_template_free(ctrl_template *t);
/* Renders with `vars` (a JSON object; each member is a variable). *text (NUL-terminated) and
 * *generation_mask (one byte per text byte, 1 = inside a generation block; may be NULL) are malloc'd.
 * A raise_exception() in the template, like any render error, is CTRL_ERR_FORMAT with its message. */
ctrl_status ctrl_template_render(const ctrl_template *t, const cJSON *vars, char **text, size_t *len,
                                 uint8_t **generation_mask);

#endif
