/* Scoring a token sequence without generating (see ctrl_engine_score in engine.h): the sequence
 * runs through the model in chunks on a block table of its own in the engine's KV pool, and every
 * position's logits give the next token's log-probability, rank and the k most likely tokens. */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "generate/engine_internal.h"

enum { SCORE_CHUNK = 64 }; /* tokens per model call: CHUNK x vocab logits at a time */

/* Position `row`'s logits -> the next token `next`'s log-probability and rank, and the top k. */
static void score_row(float *l, int V, float temperature, int32_t next, int k, float *logprob, int32_t *rank,
                      int32_t *top_ids, float *top_lps) {
    if (temperature > 0 && temperature != 1.0f)
        for (int i = 0; i < V; i++) l[i] = fminf(l[i] / temperature, FLT_MAX);
    float mx = -INFINITY;
    for (int i = 0; i < V; i++) mx = l[i] > mx ? l[i] : mx;
    double s = 0;
    for (int i = 0; i < V; i++) s += exp((double)l[i] - mx);
    const double lse = mx + log(s);
    int r = 1;
    for (int i = 0; i < V; i++) r += l[i] > l[next] || (l[i] == l[next] && i < next);
    *logprob = (float)((double)l[next] - lse), *rank = r;
    if (k > 0) {
        const int got = ctrl_sampling_top(l, V, k, top_ids, top_lps);
        for (int j = got; j < k; j++) top_ids[j] = -1, top_lps[j] = -INFINITY;
    }
}

ctrl_status ctrl_engine_score(ctrl_engine *e, const int32_t *ids, int n, float temperature, int k,
                              float *logprob, int32_t *rank, int32_t *top_ids, float *top_logprobs) {
    return ctrl_engine_score_adapter(e, 0, ids, n, temperature, k, logprob, rank, top_ids, top_logprobs);
}

ctrl_status ctrl_engine_score_adapter(ctrl_engine *e, int adapter, const int32_t *ids, int n,
                                      float temperature, int k, float *logprob, int32_t *rank,
                                      int32_t *top_ids, float *top_logprobs) {
    if (adapter < 0 || adapter > ctrl_model_adapter_count(e->model))
        return ctrl_error_set(CTRL_ERR_CONFIG, "scoring: no LoRA adapter %d", adapter);
    if (e->asleep)
        return ctrl_error_set(CTRL_ERR_RUNTIME, "generation: the engine is asleep (wake_up first)");
    if (n < 1 || k < 0) return ctrl_error_set(CTRL_ERR_CONFIG, "scoring: an empty sequence");
    const int V = ctrl_model_cfg(e->model)->vocab_size;
    float *logits = malloc(sizeof(float) * (size_t)SCORE_CHUNK * V);
    if (!logits) return ctrl_error_set(CTRL_ERR_NOMEM, "scoring: out of memory");
    ctrl_kv_seq seq = {0};
    ctrl_status st = CTRL_OK;
    for (int at = 0; at < n - 1 && st == CTRL_OK;) { /* the last token predicts nothing scored */
        const int m = n - 1 - at < SCORE_CHUNK ? n - 1 - at : SCORE_CHUNK;
        st = ctrl_kv_seq_reserve(e->kv, &seq, at + m);
        if (st != CTRL_OK && e->prefix) { /* cached prompts give their blocks back first */
            ctrl_prefix_cache_reset(e->prefix, e->kv);
            st = ctrl_kv_seq_reserve(e->kv, &seq, at + m);
        }
        if (st == CTRL_OK && adapter) ctrl_model_set_decode_adapters(e->model, &adapter);
        if (st == CTRL_OK) st = ctrl_model_decode_all(e->model, e->kv, &seq, ids + at, m, logits);
        for (int j = 0; j < m && st == CTRL_OK; j++) {
            const int pos = at + j + 1; /* the position scored: ids[pos] after ids[0..pos) */
            score_row(logits + (size_t)j * V, V, temperature, ids[pos], k, &logprob[pos], &rank[pos],
                      top_ids + (size_t)pos * k, top_logprobs + (size_t)pos * k);
        }
        at += m;
    }
    ctrl_kv_seq_release(e->kv, &seq);
    free(logits);
    if (st == CTRL_OK) logprob[0] = NAN, rank[0] = 0;
    return st;
}
