/* The batch as one JSON object and the scores' reply, for the reward plugins that hand the work to
 * another program (`command` over a pipe; the same shape over HTTP): {"prompts": [...],
 * "completions": [...], "completion_ids": [[...], ...], "<column>": [...], ...} -- the row's other
 * columns with their JSON values (null where a row lacks one), as TRL passes them to a reward
 * function's **kwargs -- and back a JSON list of one number or null per completion. */
#ifndef CTRL_PLUGINS_REWARD_JSON_H
#define CTRL_PLUGINS_REWARD_JSON_H

#include <cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <ctrl/plugin_api.h>

/* The batch as compact JSON text (malloc'd), or NULL out of memory. */
static inline char *reward_json_batch(const ctrl_reward_batch *b) {
    cJSON *o = cJSON_CreateObject(), *p = cJSON_AddArrayToObject(o, "prompts"),
          *c = cJSON_AddArrayToObject(o, "completions"), *ids = cJSON_AddArrayToObject(o, "completion_ids");
    for (int i = 0; o && p && c && ids && i < b->n; i++) {
        cJSON_AddItemToArray(p, cJSON_CreateString(b->prompts[i] ? b->prompts[i] : ""));
        cJSON_AddItemToArray(c, cJSON_CreateString(b->completions[i] ? b->completions[i] : ""));
        cJSON *row = cJSON_CreateArray();
        for (int k = 0; row && k < b->completion_lens[i]; k++)
            cJSON_AddItemToArray(row, cJSON_CreateNumber(b->completion_ids[i][k]));
        cJSON_AddItemToArray(ids, row);
    }
    for (int j = 0; o && j < b->n_columns; j++) {
        const ctrl_reward_column *col = &b->columns[j];
        if (!strcmp(col->name, "prompts") || !strcmp(col->name, "completions") ||
            !strcmp(col->name, "completion_ids"))
            continue; /* TRL's own arguments win */
        cJSON *a = cJSON_AddArrayToObject(o, col->name);
        for (int i = 0; a && i < b->n; i++) {
            cJSON *v = col->values[i] ? cJSON_Parse(col->values[i]) : NULL;
            cJSON_AddItemToArray(a, v ? v : cJSON_CreateNull());
        }
    }
    char *text = o ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    return text;
}

/* Parses the reply: a JSON list of n finite numbers or nulls (null -> NaN: the reward does not
 * apply). NaN and infinities are refused: not JSON (Python's json.dumps writes them as NaN and
 * Infinity unless told not to), or too large for a float. */
static inline ctrl_status reward_json_scores(const char *name, const char *reply, int n, float *out) {
    cJSON *a = cJSON_Parse(reply);
    int ok = cJSON_IsArray(a) && cJSON_GetArraySize(a) == n, bad_number = -1;
    for (int i = 0; ok && i < n; i++) {
        const cJSON *v = cJSON_GetArrayItem(a, i);
        if (cJSON_IsNumber(v) && isfinite((float)v->valuedouble))
            out[i] = (float)v->valuedouble;
        else if (cJSON_IsNull(v))
            out[i] = NAN;
        else
            ok = 0, bad_number = cJSON_IsNumber(v) ? i : -1;
    }
    cJSON_Delete(a);
    if (ok) return CTRL_OK;
    if (bad_number >= 0 || strstr(reply, "NaN") || strstr(reply, "Infinity"))
        return ctrl_error_set(
            CTRL_ERR_RUNTIME,
            "reward %s: the reply holds NaN or an infinite score (send null where the reward "
            "does not apply): %.200s",
            name, reply);
    return ctrl_error_set(
        CTRL_ERR_RUNTIME,
        "reward %s: the reply is not a JSON list of %d numbers or nulls (one per completion): "
        "%.200s",
        name, n, reply);
}

#endif
