/* The [reward.NAME] reward functions of a run (see online.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "train/online.h"

struct ctrl_reward_set {
    int n;
    char **names;
    double *weights;
    const ctrl_reward_ops **ops;
    ctrl_reward **inst;
};

ctrl_status ctrl_reward_set_create(const ctrl_config *cfg, const ctrl_run_plugins *plugins,
                                   ctrl_reward_set **out) {
    ctrl_reward_set *r = calloc(1, sizeof *r);
    const int nr = plugins->n_rewards;
    if (r) {
        r->names = calloc((size_t)nr + 1, sizeof(char *));
        r->weights = calloc((size_t)nr + 1, sizeof(double));
        r->ops = calloc((size_t)nr + 1, sizeof(*r->ops));
        r->inst = calloc((size_t)nr + 1, sizeof(*r->inst));
    }
    ctrl_status st = r && r->names && r->weights && r->ops && r->inst
                         ? CTRL_OK
                         : ctrl_error_set(CTRL_ERR_NOMEM, "rewards: out of memory");
    for (int i = 0; i < nr && st == CTRL_OK; i++) {
        const ctrl_run_reward *rw = &plugins->reward[i];
        r->ops[r->n] = rw->plugin->ops;
        r->names[r->n] = strdup(rw->name);
        r->weights[r->n] = rw->weight;
        st = r->names[r->n] ? r->ops[r->n]->create(ctrl_host_table(), cfg, rw->section, &r->inst[r->n])
                            : ctrl_error_set(CTRL_ERR_NOMEM, "rewards: out of memory");
        if (st == CTRL_OK)
            r->n++;
        else
            free(r->names[r->n]);
    }
    if (st == CTRL_OK && r->n == 0)
        st = ctrl_error_set(CTRL_ERR_CONFIG, "an online trainer needs at least one [reward.NAME] section "
                                             "(e.g. [reward.len] plugin = length)");
    if (st != CTRL_OK) {
        ctrl_reward_set_free(r);
        return st;
    }
    *out = r;
    return CTRL_OK;
}

int ctrl_reward_set_count(const ctrl_reward_set *r) { return r->n; }
const char *ctrl_reward_set_name(const ctrl_reward_set *r, int i) { return r->names[i]; }

ctrl_status ctrl_reward_set_score(ctrl_reward_set *r, const ctrl_reward_batch *b, float *scores,
                                  float *total) {
    float *one = malloc(sizeof(float) * (size_t)b->n);
    ctrl_status st = one ? CTRL_OK : ctrl_error_set(CTRL_ERR_NOMEM, "rewards: out of memory");
    for (int k = 0; k < r->n && st == CTRL_OK; k++) {
        for (int i = 0; i < b->n; i++) one[i] = NAN;
        st = r->ops[k]->score(r->inst[k], b, one);
        if (st != CTRL_OK) st = ctrl_error_wrap(st, "reward '%s'", r->names[k]);
        for (int i = 0; i < b->n; i++) scores[i * r->n + k] = one[i];
    }
    for (int i = 0; st == CTRL_OK && i < b->n; i++) {
        double sum = 0;
        int any = 0;
        for (int k = 0; k < r->n; k++)
            if (!isnan(scores[i * r->n + k])) sum += r->weights[k] * scores[i * r->n + k], any = 1;
        total[i] = any ? (float)sum : NAN;
    }
    free(one);
    return st;
}

void ctrl_reward_set_free(ctrl_reward_set *r) {
    if (!r) return;
    for (int k = 0; k < r->n; k++) r->ops[k]->destroy(r->inst[k]), free(r->names[k]);
    free(r->names), free(r->weights), free(r->ops), free(r->inst);
    free(r);
}
