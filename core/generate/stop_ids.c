/* What a trainer's generation takes from its model and settings (see engine.h): the ids that end a
 * completion, the sampling parameters. */
#include <cJSON.h>
#include <stdio.h>
#include <stdlib.h>

#include "config/config_load.h"
#include "file_text.h"
#include "generate/engine.h"

int ctrl_generation_stop_ids(const char *model_dir, const ctrl_tokenizer *tok, int32_t *ids, int cap) {
    char path[4200];
    snprintf(path, sizeof path, "%s/generation_config.json", model_dir);
    ctrl_status st;
    char *text = ctrl_read_text_file(path, 1 << 20, &st);
    cJSON *root = text ? cJSON_Parse(text) : NULL;
    free(text);
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(root, "eos_token_id");
    int n = 0;
    if (cJSON_IsNumber(e) && cap > 0) ids[n++] = e->valueint;
    for (const cJSON *x = cJSON_IsArray(e) ? e->child : NULL; x && n < cap; x = x->next)
        if (cJSON_IsNumber(x)) ids[n++] = x->valueint;
    cJSON_Delete(root);
    if (n == 0 && cap > 0 && ctrl_tokenizer_eos_id(tok) >= 0) ids[n++] = ctrl_tokenizer_eos_id(tok);
    return n;
}

ctrl_sampling_params ctrl_generation_sampling(const ctrl_run_settings *s, double temperature) {
    return (ctrl_sampling_params){.temperature = (float)temperature,
                                  .top_k = s->generation.top_k,
                                  .top_p = (float)s->generation.top_p,
                                  .min_p = (float)s->generation.min_p,
                                  .repetition_penalty = (float)s->generation.repetition_penalty};
}
