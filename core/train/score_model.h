/* Reward models for the reward plugins (the host table's score_model_* entries, plugin.h): a
 * sequence-classification directory loaded on the run's device with the run's attention plugin,
 * and texts scored as TRL scores completions with a reward model: each tokenized without special
 * tokens, the score read at its last non-pad token (ctrl_model_score_index). */
#ifndef CTRL_CORE_TRAIN_SCORE_MODEL_H
#define CTRL_CORE_TRAIN_SCORE_MODEL_H

#include <ctrl/plugin.h>

/* `tokenizer` NULL: the model directory's. */
ctrl_status ctrl_score_model_open(const ctrl_config *cfg, const char *dir, const char *tokenizer,
                                  ctrl_score_model **out);
/* out[i] = the first label's score of texts[i]; `batch_size` sequences per forward (any split gives
 * the same scores). */
ctrl_status ctrl_score_model_score(ctrl_score_model *m, const char *const *texts, int n, int batch_size,
                                   float *out);
void ctrl_score_model_close(ctrl_score_model *m);
/* messages_json (a JSON array) + the completion as the assistant's message, rendered with the
 * model's tokenizer's chat template, no generation prompt (TRL's apply_chat_template of
 * {"messages": prompt + completion}); *text malloc'd. */
ctrl_status ctrl_score_model_chat_text(ctrl_score_model *m, const char *messages_json, const char *completion,
                                       char **text);

#endif
