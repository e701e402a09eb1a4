/* One preference row to token ids with TRL 1.16's semantics (pref_data.h lists the formats):
 * the prompt extraction of implicit-prompt rows, EOS text, chat templates and where the
 * completion starts. Internal to pref_data.c. */
#ifndef CTRL_CORE_TRAIN_PREF_FORMAT_H
#define CTRL_CORE_TRAIN_PREF_FORMAT_H

#include <cJSON.h>

#include "train/pref_data.h"

typedef struct pref_format pref_format;

/* Reads [data] prompt_field, completion_field and chat_template_path. */
ctrl_status pref_format_create(const ctrl_tokenizer *tok, const ctrl_config *cfg, ctrl_pref_task task,
                               pref_format **out);
void pref_format_free(pref_format *f);
/* Tokenizes `row` (which it may edit: an extracted prompt is written into it, as TRL's map does)
 * into out[0..*n_out): one row, or for KTO a paired row's chosen (label 1) and rejected (label 0)
 * halves. Ids are malloc'd (free with pref_row_free); kl_row is -1 and line 0. A malformed row sets
 * *why (naming the column; `why` points into `why_buf` of why_cap bytes) and returns CTRL_OK; errors
 * no row can fix (no chat template, a template error, out of memory) return a status. */
ctrl_status pref_format_row(pref_format *f, cJSON *row, ctrl_pref_row out[2], int *n_out, const char **why,
                            char *why_buf, size_t why_cap);
void pref_row_free(ctrl_pref_row *r);

#endif
