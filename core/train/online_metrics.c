/* The online loop's metrics (see online_internal.h): reward scoring through the [reward.NAME]
 * functions, TRL's generation metrics, completions.jsonl, and the logging window's means. */
#include <cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "train/online_internal.h"

void ctrl_online_report(ctrl_online *o, const char *name, double value) {
    int i = 0;
    while (i < o->n_metrics && strcmp(o->mname[i], name)) i++;
    if (i == o->n_metrics) {
        if (i == MAX_METRICS) return;
        o->mname[o->n_metrics++] = strdup(name), o->msum[i] = 0, o->mcount[i] = 0;
    }
    if (!isnan(value)) o->msum[i] += value, o->mcount[i]++;
}

void online_report(void *ctx, const char *name, double value) { ctrl_online_report(ctx, name, value); }

/* Scores the generation batch: rewards per function into *scores, totals into *total. */
ctrl_status online_score(ctrl_online *o, const ctrl_prompt_set *ps, int c0, int n, float **scores,
                         float **total) {
    const int gn = o->gn, R = ctrl_reward_set_count(o->rewards);
    char **texts = calloc((size_t)n, sizeof(char *));
    const char **prompts = malloc(sizeof(char *) * n), **messages = malloc(sizeof(char *) * n);
    const int32_t **ids = malloc(sizeof(int32_t *) * n);
    int *lens = malloc(sizeof(int) * n);
    ctrl_reward_column *cols = calloc((size_t)ps->n_cols + 1, sizeof *cols);
    *scores = calloc((size_t)gn * (size_t)R, sizeof(float)), *total = calloc((size_t)gn, sizeof(float));
    ctrl_status st = texts && prompts && messages && ids && lens && cols && *scores && *total
                         ? CTRL_OK
                         : ctrl_error_set(CTRL_ERR_NOMEM, "rewards: out of memory for %d completions", n);
    for (int i = 0; i < n && st == CTRL_OK; i++) {
        size_t len;
        const ctrl_gen_output *g = &o->gout[c0 + i];
        st = ctrl_tokenizer_decode(o->tok, g->ids, (size_t)g->len, 1, &texts[i], &len);
        prompts[i] = ps->text[o->gprompt[c0 + i]], ids[i] = g->ids, lens[i] = g->len;
        messages[i] = ps->messages ? ps->messages[o->gprompt[c0 + i]] : NULL;
    }
    for (int k = 0; k < ps->n_cols && st == CTRL_OK; k++) {
        const char **v = malloc(sizeof(char *) * (size_t)n);
        if (!v) {
            st = ctrl_error_set(CTRL_ERR_NOMEM, "rewards: out of memory");
            break;
        }
        for (int i = 0; i < n; i++) v[i] = ps->values[o->gprompt[c0 + i]][k];
        cols[k] = (ctrl_reward_column){.name = ps->cols[k], .values = v};
    }
    ctrl_reward_batch rb = {.size = sizeof rb,
                            .n = n,
                            .prompts = prompts,
                            .completions = (const char *const *)texts,
                            .completion_ids = ids,
                            .completion_lens = lens,
                            .n_columns = ps->n_cols,
                            .columns = cols,
                            .prompt_messages = messages};
    if (st == CTRL_OK) st = ctrl_reward_set_score(o->rewards, &rb, *scores + (size_t)c0 * R, *total + c0);
    for (int k = 0; cols && k < ps->n_cols; k++) free((void *)cols[k].values);
    for (int i = 0; texts && i < n; i++) free(texts[i]);
    free(texts), free(prompts), free(messages), free(ids), free(lens), free(cols);
    return st;
}

double online_nanmean(const float *x, int n, int stride, double *std) {
    double s = 0, ss = 0;
    int k = 0;
    for (int i = 0; i < n; i++)
        if (!isnan(x[i * stride])) s += x[i * stride], k++;
    const double mean = k ? s / k : NAN;
    for (int i = 0; i < n; i++)
        if (!isnan(x[i * stride])) ss += (x[i * stride] - mean) * (x[i * stride] - mean);
    if (std) *std = k > 1 ? sqrt(ss / (k - 1)) : NAN;
    return mean;
}

/* TRL's generation metrics: completion lengths, clipped ratio, rewards. */
void online_generation_metrics(ctrl_online *o, const float *scores, const float *total) {
    const int n = o->gn, R = ctrl_reward_set_count(o->rewards);
    double sum = 0, tsum = 0, mn = INFINITY, mx = 0, tmn = INFINITY, tmx = 0;
    int clipped = 0;
    for (int i = 0; i < n; i++) {
        const double L = o->gout[i].len;
        sum += L, mn = fmin(mn, L), mx = fmax(mx, L);
        if (!o->gout[i].stopped)
            clipped++;
        else
            tsum += L, tmn = fmin(tmn, L), tmx = fmax(tmx, L);
    }
    ctrl_online_report(o, "completions/mean_length", sum / n);
    ctrl_online_report(o, "completions/min_length", mn);
    ctrl_online_report(o, "completions/max_length", mx);
    ctrl_online_report(o, "completions/clipped_ratio", (double)clipped / n);
    const int term = n - clipped;
    ctrl_online_report(o, "completions/mean_terminated_length", term ? tsum / term : 0);
    ctrl_online_report(o, "completions/min_terminated_length", term ? tmn : 0);
    ctrl_online_report(o, "completions/max_terminated_length", term ? tmx : 0);
    char name[160];
    for (int k = 0; k < R; k++) {
        double std;
        const double mean = online_nanmean(scores + k, n, R, &std);
        snprintf(name, sizeof name, "rewards/%s/mean", ctrl_reward_set_name(o->rewards, k));
        ctrl_online_report(o, name, mean);
        snprintf(name, sizeof name, "rewards/%s/std", ctrl_reward_set_name(o->rewards, k));
        ctrl_online_report(o, name, std);
    }
    double std;
    ctrl_online_report(o, "reward", online_nanmean(total, n, 1, &std));
    ctrl_online_report(o, "reward_std", std);
}

/* completions.jsonl: one line per completion of the generation batch (TRL's log_completions). */
void online_log_completions(ctrl_online *o, const float *scores) {
    const int R = ctrl_reward_set_count(o->rewards);
    for (int i = 0; i < o->gn; i++) {
        cJSON *l = cJSON_CreateObject(), *rw = cJSON_CreateObject();
        char *text = NULL;
        size_t len;
        ctrl_tokenizer_decode(o->tok, o->gout[i].ids, (size_t)o->gout[i].len, 1, &text, &len);
        cJSON_AddNumberToObject(l, "generation_batch", (double)o->batches);
        cJSON_AddStringToObject(l, "prompt", o->train.text[o->gprompt[i]]);
        cJSON_AddStringToObject(l, "completion", text ? text : "");
        for (int k = 0; k < R; k++) {
            const float v = scores[i * R + k];
            cJSON_AddItemToObject(rw, ctrl_reward_set_name(o->rewards, k),
                                  isnan(v) ? cJSON_CreateNull() : cJSON_CreateNumber(v));
        }
        cJSON_AddItemToObject(l, "rewards", rw);
        cJSON_AddNumberToObject(l, "advantage", o->adv[i]);
        char *s = cJSON_PrintUnformatted(l);
        fprintf(o->completions, "%s\n", s);
        cJSON_free(s), cJSON_Delete(l), free(text);
    }
    fflush(o->completions);
}

void online_write_metric(FILE *f, const char *name, double v) {
    if (isnan(v) || isinf(v))
        fprintf(f, "\"%s\": null, ", name);
    else
        fprintf(f, "\"%s\": %.6g, ", name, v);
}

void ctrl_online_log_window(ctrl_online *o, FILE *f) {
    for (int i = 0; i < o->n_metrics; i++) {
        online_write_metric(f, o->mname[i], o->mcount[i] ? o->msum[i] / o->mcount[i] : NAN);
        o->msum[i] = o->msynced[i] = 0, o->mcount[i] = o->csynced[i] = 0;
    }
}
