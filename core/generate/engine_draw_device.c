/* A decode step's draws on the model's device (engine_schedule.c calls it when the backend has a
 * `sample` op): the logits stay where the head wrote them; what goes there is each draw's
 * parameters, its uniform draw from the sequence's own generator (as the host sampler draws it: one
 * per token when temperature > 0), log(min_p), the logit bias and suppressed stop ids, and the
 * distinct ids the penalties apply to with their counts in the completion; what comes back is each
 * token, its log-probability and the top log-probabilities asked for. The processing is
 * core/generate/sampling.c's (kernels/cuda/sampling.cu says where the two may differ). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "device/backend.h"
#include "generate/engine_internal.h"

/* the ids and values of one step's rows (edits and seen lists), grown as rows are added */
typedef struct lists {
    int32_t *ids;
    float *vals;
    int n, cap;
} lists;

static int push(lists *l, int32_t id, float v) {
    if (l->n == l->cap) {
        const int cap = l->cap ? 2 * l->cap : 256;
        int32_t *ids = realloc(l->ids, sizeof(int32_t) * (size_t)cap);
        if (ids) l->ids = ids;
        float *vals = realloc(l->vals, sizeof(float) * (size_t)cap);
        if (vals) l->vals = vals;
        if (!ids || !vals) return -1;
        l->cap = cap;
    }
    l->ids[l->n] = id, l->vals[l->n++] = v;
    return 0;
}

static int by_key(const void *a, const void *b) {
    const int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* The distinct ids of tokens[from, n) in range, each with how many of them are at or after n_prompt
 * (the completion): sorted keys id * 2 + (in the completion), then counted. */
static int seen_list(lists *l, const int32_t *tokens, int from, int n, int n_prompt, int V) {
    if (n <= from) return 0;
    int64_t *keys = malloc(sizeof(int64_t) * (size_t)(n - from));
    if (!keys) return -1;
    int m = 0;
    for (int i = from; i < n; i++)
        if (tokens[i] >= 0 && tokens[i] < V) keys[m++] = (int64_t)tokens[i] * 2 + (i >= n_prompt);
    qsort(keys, (size_t)m, sizeof *keys, by_key);
    int rc = 0;
    for (int i = 0; i < m && rc == 0;) {
        const int64_t id = keys[i] / 2;
        int count = 0;
        for (; i < m && keys[i] / 2 == id; i++) count += (int)(keys[i] & 1);
        rc = push(l, (int32_t)id, (float)count);
    }
    free(keys);
    return rc;
}

/* Row i's description from draw d (its lists appended to l); 0, -1 when out of memory. */
static int describe(ctrl_sample_row *row, gen_draw *d, lists *l, int V, int *tops) {
    const ctrl_gen_request *r = &d->s->rq->r;
    const ctrl_sampling_params *p = &r->sampling;
    *row = (ctrl_sample_row){.temperature = p->temperature,
                             .top_p = p->top_p,
                             .min_p = p->min_p,
                             .repetition_penalty = p->repetition_penalty,
                             .presence_penalty = p->presence_penalty,
                             .frequency_penalty = p->frequency_penalty,
                             .top_k = p->top_k,
                             .src = d->row,
                             .edit_at = l->n,
                             .n_top = r->top_logprobs,
                             .top_at = *tops};
    if (p->min_p > 0) row->min_p_log = log((double)p->min_p);
    *tops += r->top_logprobs;
    for (int b = 0; b < r->n_bias; b++)
        if (r->bias_ids[b] >= 0 && r->bias_ids[b] < V && push(l, r->bias_ids[b], r->bias[b]) != 0) return -1;
    if (d->s->n_tokens - r->prompt_len < r->min_tokens) /* too early to stop */
        for (int j = 0; j < r->n_stop; j++)
            if (r->stop_ids[j] >= 0 && r->stop_ids[j] < V && push(l, r->stop_ids[j], -INFINITY) != 0)
                return -1;
    row->n_edit = l->n - row->edit_at, row->seen_at = l->n;
    int n_prompt = r->prompt_len;
    const int n_seen = d->s->n_tokens;
    if (n_prompt < 0 || n_prompt > n_seen) n_prompt = n_seen;
    const int penalized = (p->presence_penalty != 0 || p->frequency_penalty != 0) && n_seen > n_prompt;
    /* the repetition penalty's ids are every seen one; without it only the completion's matter */
    if ((p->repetition_penalty != 1.0f || penalized) &&
        seen_list(l, d->s->tokens, p->repetition_penalty != 1.0f ? 0 : n_prompt, n_seen, n_prompt, V) != 0)
        return -1;
    row->n_seen = l->n - row->seen_at;
    if (p->temperature > 0) row->u = ctrl_rng_uniform(&d->s->rng);
    return 0;
}

int engine_draws_on_device(const ctrl_engine *e) {
    const ctrl_backend_ops *be = ctrl_model_backend(e->model);
    return !be->host_memory && ctrl_backend_has(be, sample);
}

ctrl_status engine_draw_device(ctrl_engine *e, gen_draw *draws, int n) {
    const ctrl_backend_ops *be = ctrl_model_backend(e->model);
    const ctrl_model_config *c = ctrl_model_cfg(e->model);
    const int V = c->vocab_size;
    for (int i = 0; i < n; i++) /* as the host sampler: invalid parameters draw nothing */
        if (!ctrl_sampling_params_valid(&draws[i].s->rq->r.sampling))
            return ctrl_error_set(CTRL_ERR_CONFIG, "generation: invalid sampling parameters");
    ctrl_sample_row *rows = malloc(sizeof *rows * (size_t)n);
    lists l = {0};
    int tops = 0, failed = rows == NULL;
    for (int i = 0; i < n && !failed; i++) failed = describe(&rows[i], &draws[i], &l, V, &tops) != 0;
    const size_t n_out = (size_t)n + (size_t)tops;
    ctrl_sample_out *out = failed ? NULL : malloc(sizeof *out * n_out);
    if (!out) {
        free(rows), free(l.ids), free(l.vals);
        return ctrl_error_set(CTRL_ERR_NOMEM, "generation: out of memory");
    }
    /* one device buffer: rows, ids, values, results (each part 8-byte aligned) */
    const size_t b_rows = sizeof *rows * (size_t)n,
                 b_ids = ((sizeof(int32_t) * (size_t)l.n + 7) & ~(size_t)7),
                 b_vals = ((sizeof(float) * (size_t)l.n + 7) & ~(size_t)7), b_out = sizeof *out * n_out;
    char *dev = NULL;
    ctrl_status st = be->alloc((void **)&dev, b_rows + b_ids + b_vals + b_out);
    if (st == CTRL_OK) st = be->to_device(dev, rows, b_rows);
    if (st == CTRL_OK && l.n) st = be->to_device(dev + b_rows, l.ids, sizeof(int32_t) * (size_t)l.n);
    if (st == CTRL_OK && l.n) st = be->to_device(dev + b_rows + b_ids, l.vals, sizeof(float) * (size_t)l.n);
    ctrl_sample_out *dev_out = (ctrl_sample_out *)(dev + b_rows + b_ids + b_vals);
    const ctrl_sample_batch b = {.logits = ctrl_model_decode_logits(e->model),
                                 .V = V,
                                 .n_rows = n,
                                 .softcap = c->final_softcap,
                                 .rows = (const ctrl_sample_row *)dev,
                                 .ids = (const int32_t *)(dev + b_rows),
                                 .vals = (const float *)(dev + b_rows + b_ids),
                                 .out = dev_out};
    if (st == CTRL_OK) st = be->sample(&b);
    if (st == CTRL_OK) st = be->to_host(out, dev_out, b_out);
    be->free(dev);
    for (int i = 0; i < n && st == CTRL_OK; i++) {
        gen_draw *d = &draws[i];
        d->tok = out[i].id, d->logprob = out[i].logprob;
        for (int j = 0; j < rows[i].n_top; j++)
            d->top_ids[j] = out[n + rows[i].top_at + j].id,
            d->top_lps[j] = out[n + rows[i].top_at + j].logprob;
    }
    if (st == CTRL_OK) e->device_draws += n;
    free(rows), free(out), free(l.ids), free(l.vals);
    return st;
}

long ctrl_engine_device_draws(const ctrl_engine *e) { return e->device_draws; }
