/* Incremental decoding over a paged KV cache (see model.h): the new tokens of several sequences run
 * through the same layer code as training (model_layer_forward) as one flat batch; only the
 * attention differs — each layer appends the new K/V to the cache (the backend's kv_append) and the
 * `paged` attention plugin (ctrl_model_set_paged_attention) attends over it through the sequences'
 * block tables. The head gives the logits of each sequence's last new token. Decoding has scratch
 * of its own (one layer's internals), so a training forward's saved activations survive it.
 * Everything runs on the model's backend: on a device the cache, the scratch, the K/V append, the
 * attention and the head are in device memory, the call's int32 inputs go there in one copy, and
 * the logits come back in one copy, or stay there for sampling on the device (logits == NULL). */
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "model/kv_cache.h"
#include "model/model_internal.h"

typedef struct decode_ctx {
    ctrl_kv_cache *c;
    int n_seq, max_pos;
    const int32_t *seq_of;       /* [T] the sequence of each new token (on the backend) */
    const int32_t *slots;        /* [T] each new token's row in a layer's pool (on the backend) */
    const int32_t *block_tables; /* [n_seq, max_blocks] (on the backend) */
    int max_blocks;
} decode_ctx;

/* model_attention_fn for decoding: append the new tokens' K/V to the cache (a token sees itself),
 * then the paged attention plugin attends over it. */
static ctrl_status paged_attention(ctrl_model *m, int l, layer_acts *a, void *ctx) {
    const decode_ctx *d = ctx;
    const ctrl_model_config *cfg = &m->cfg;
    const int T = m->T, KD = cfg->n_kv_heads * cfg->head_dim;
    ctrl_status st = m->be->kv_append(ctrl_kv_layer(d->c, 0, l), ctrl_kv_layer(d->c, 1, l), a->k, a->v,
                                      d->slots, T, KD, d->c->dtype);
    if (st != CTRL_OK) return ctrl_error_wrap(st, "layer %d: appending to the KV cache", l);
    const ctrl_paged_attention_args args = {.size = sizeof args,
                                            .device = m->device,
                                            .dtype = CTRL_F32,
                                            .n_tokens = T,
                                            .n_seqs = d->n_seq,
                                            .n_head = cfg->n_heads,
                                            .n_kv_head = cfg->n_kv_heads,
                                            .head_dim = cfg->head_dim,
                                            .scale = cfg->attn_scale > 0 ? cfg->attn_scale
                                                                         : 1.0f / sqrtf((float)cfg->head_dim),
                                            .window = ctrl_model_layer_window(cfg, l),
                                            .q = a->q,
                                            .out = a->att,
                                            .k_cache = ctrl_kv_layer(d->c, 0, l),
                                            .v_cache = ctrl_kv_layer(d->c, 1, l),
                                            .n_blocks = d->c->n_blocks,
                                            .block_size = d->c->block_size,
                                            .block_tables = d->block_tables,
                                            .max_blocks_per_seq = d->max_blocks,
                                            .seq_of_token = d->seq_of,
                                            .positions = m->dev_batch.positions,
                                            .max_position = d->max_pos,
                                            .cache_dtype = d->c->dtype,
                                            .softcap = cfg->attn_softcap};
    st = m->paged->paged_forward(&args);
    return st == CTRL_OK ? CTRL_OK : ctrl_error_wrap(st, "layer %d paged attention", l);
}

ctrl_status ctrl_model_set_paged_attention(ctrl_model *m, const ctrl_attention_ops *ops) {
    if (!ops || ops->size < offsetof(ctrl_attention_ops, paged_forward) + sizeof(void *) ||
        !ops->paged_forward)
        return ctrl_error_set(CTRL_ERR_PLUGIN,
                              "decode: the attention plugin has no paged decoding (use `paged`)");
    if (m->cfg.attn_softcap > 0 && !ctrl_attention_has(ops, CTRL_ATTENTION_SOFTCAP))
        return ctrl_error_set(
            CTRL_ERR_PLUGIN,
            "decode: %s needs attention logit soft-capping, which this paged plugin does not "
            "declare",
            m->cfg.model_type);
    m->paged = ops;
    return CTRL_OK;
}

const ctrl_attention_ops *ctrl_model_paged_attention(const ctrl_model *m) { return m->paged; }

void ctrl_model_release_decode_scratch(ctrl_model *m) {
    model_pack_free(m, 0); /* decoding's panels; a held LoRA base's stay (they are its weights) */
    m->be->free(m->dec_mem), m->be->free(m->dec_ints), m->be->free(m->dec_logits);
    free(m->dec_pos), free(m->dec_acts);
    m->dec_mem = m->dec_out = m->dec_hin = m->dec_h = m->dec_rstd = m->dec_logits = NULL;
    m->dec_pos = m->dec_ints = NULL, m->dec_acts = NULL, m->dec_cap_T = 0;
    m->dec_ints_bytes = m->dec_logits_bytes = 0;
}

/* Decoding keeps nothing for a backward pass, so one set of layer internals serves every layer
 * and the layer inputs take turns in two buffers: scratch for T tokens, a few layers' worth less
 * than the training activations, which it leaves untouched. */
static ctrl_status decode_scratch(ctrl_model *m, int T) {
    if (T <= m->dec_cap_T) return CTRL_OK;
    const ctrl_model_config *c = &m->cfg;
    const size_t C = c->hidden_size, I = c->intermediate_size, QD = (size_t)c->n_heads * c->head_dim,
                 KD = (size_t)c->n_kv_heads * c->head_dim;
    const size_t internals =
        3 * C + 2 + 3 * QD + 4 * KD + 2 * c->n_heads + c->n_kv_heads + 3 * I + model_arch_act_floats(c);
    m->be->free(m->dec_mem), free(m->dec_pos);
    m->dec_mem = NULL, m->dec_cap_T = 0;
    const size_t bytes = sizeof(float) * (size_t)T * (internals + 5 * C + 1);
    ctrl_status st = m->be->alloc((void **)&m->dec_mem, bytes);
    if (st != CTRL_OK) m->dec_mem = NULL;
    m->dec_pos = malloc(sizeof(int32_t) * (size_t)T);
    if (!m->dec_acts) m->dec_acts = calloc((size_t)c->n_layers, sizeof *m->dec_acts);
    if (!m->dec_mem || !m->dec_pos || !m->dec_acts)
        return ctrl_error_set(CTRL_ERR_NOMEM, "decode: scratch for %d tokens (%zu bytes on %s)", T, bytes,
                              m->be->name);
    float *p = m->dec_mem;
#define TAKE(n) (p += (size_t)T * (n), p - (size_t)T * (n))
    layer_acts w = {0}; /* no lora_xa: decoding has no backward (lora.c uses scratch) */
    w.ln1 = TAKE(C), w.rstd1 = TAKE(1), w.q_raw = TAKE(QD), w.k_raw = TAKE(KD), w.q_rstd = TAKE(c->n_heads);
    w.k_rstd = TAKE(c->n_kv_heads), w.q = TAKE(QD), w.k = TAKE(KD), w.v = TAKE(KD), w.att = TAKE(QD);
    w.lse = TAKE(c->n_heads), w.x_mid = TAKE(C), w.ln2 = TAKE(C), w.rstd2 = TAKE(1), w.g = TAKE(I);
    w.u = TAKE(I), w.h = TAKE(I);
    model_arch_take_acts(c, &w, &p, T);
    float *x[2];
    x[0] = TAKE(C), x[1] = TAKE(C); /* in order: an initializer list's are unsequenced */
    m->dec_out = TAKE(C), m->dec_hin = TAKE(C), m->dec_h = TAKE(C), m->dec_rstd = TAKE(1);
#undef TAKE
    for (int l = 0; l < c->n_layers; l++) m->dec_acts[l] = w, m->dec_acts[l].x_in = x[l % 2];
    m->dec_cap_T = T;
    return CTRL_OK;
}

/* all_rows: every new token's logits (T rows), else each sequence's last one's (n_seq rows) */
static ctrl_status decode(ctrl_model *m, ctrl_kv_cache *c, ctrl_kv_seq *const *seqs, const int32_t *tokens,
                          const int *n_new, int n_seq, float *logits, int all_rows) {
    const ctrl_model_config *cfg = &m->cfg;
    const ctrl_backend_ops *be = m->be;
    const int C = cfg->hidden_size, V = cfg->vocab_size;
    if (!m->paged)
        return ctrl_error_set(CTRL_ERR_PLUGIN,
                              "decode: no paged attention plugin (the `paged` plugin decodes)");
    if (m->off_lm_head < 0)
        return ctrl_error_set(CTRL_ERR_RUNTIME,
                              "decode: a sequence classifier has no LM head to decode with");
    if (!ctrl_backend_has(be, kv_append))
        return ctrl_error_set(CTRL_ERR_UNSUPPORTED, "decode: the %s backend has no KV cache append",
                              be->name);
    if (c->be != (be->host_memory ? NULL : be))
        return ctrl_error_set(CTRL_ERR_RUNTIME, "decode: the KV cache is on %s, the model on %s",
                              c->be ? c->be->name : "the host", be->name);
    if (m->dec_adapters && !be->host_memory) /* lora_bank.c computes in host memory */
        return ctrl_error_set(CTRL_ERR_UNSUPPORTED,
                              "decode: serving several LoRA adapters runs on the CPU only so far, not on %s",
                              be->name);
    int T = 0, max_pos = 0;
    for (int s = 0; s < n_seq; s++) {
        if (n_new[s] < 1) return ctrl_error_set(CTRL_ERR_RUNTIME, "decode: sequence %d has no new token", s);
        T += n_new[s];
        max_pos = seqs[s]->len + n_new[s] > max_pos ? seqs[s]->len + n_new[s] : max_pos;
    }
    for (int t = 0; t < T; t++)
        if (tokens[t] < 0 || tokens[t] >= V)
            return ctrl_error_set(CTRL_ERR_RUNTIME, "decode: token %d is outside the vocabulary (%d)",
                                  tokens[t], V);
    ctrl_status st = model_check_backend(m, be);
    if (st == CTRL_OK) st = model_ensure_rope(m, max_pos);
    /* AVX2 decoding's panels (model_decode_pack.c) hold the bf16 weights: no rounded fp32 copy for
     * it (a call of more rows than they serve rounds W per product, as a long forward does) */
    if (st == CTRL_OK) st = model_prepare_weights(m, model_pack_avx2(m) ? INT_MAX : T);
    if (st == CTRL_OK) st = decode_scratch(m, T);
    if (st == CTRL_OK) st = model_moe_ensure(m, T); /* decoding reuses the MoE layers' buffers */
    const int packed = model_pack_usable(m);        /* bf16 on the CPU: the weights packed once */
    for (int s = 0; s < n_seq && st == CTRL_OK; s++)
        st = ctrl_kv_seq_reserve(c, seqs[s], seqs[s]->len + n_new[s]);
    if (st != CTRL_OK) return st;
    int max_blocks = 1;
    for (int s = 0; s < n_seq; s++)
        max_blocks = seqs[s]->n_blocks > max_blocks ? seqs[s]->n_blocks : max_blocks;
    /* the call's int32 inputs in one buffer: tokens, positions, sequence of each token, cache slot
     * of each token, block tables; on a device copied there at once */
    const size_t n_ints = 4 * (size_t)T + (size_t)n_seq * max_blocks;
    int32_t *ints = calloc(n_ints, sizeof(int32_t));
    if (!ints) return ctrl_error_set(CTRL_ERR_NOMEM, "decode: scratch for %d tokens", T);
    int32_t *h_tok = ints, *h_pos = ints + T, *h_seq = ints + 2 * (size_t)T, *h_slot = ints + 3 * (size_t)T,
            *h_tab = ints + 4 * (size_t)T;
    memcpy(h_tok, tokens, sizeof(int32_t) * (size_t)T);
    for (int s = 0, t = 0; s < n_seq; s++) {
        for (int i = 0; i < n_new[s]; i++, t++) {
            const int p = seqs[s]->len + i;
            h_seq[t] = s, h_pos[t] = m->dec_pos[t] = p, h_slot[t] = ctrl_kv_slot(c, seqs[s], p);
        }
        for (int b = 0; b < seqs[s]->n_blocks; b++) h_tab[(size_t)s * max_blocks + b] = seqs[s]->blocks[b];
    }
    const int32_t *d_ints = ints;
    if (!be->host_memory) {
        st = model_grow(m, (void **)&m->dec_ints, &m->dec_ints_bytes, sizeof(int32_t) * n_ints);
        if (st == CTRL_OK) st = be->to_device(m->dec_ints, ints, sizeof(int32_t) * n_ints);
        d_ints = m->dec_ints;
    }
    const int rows = all_rows ? T : n_seq;
    float *lg = logits; /* the logits: the caller's buffer, or the device's then copied back */
    if (!logits && (be->host_memory || all_rows)) /* only a device's decode keeps them there */
        st = ctrl_error_set(CTRL_ERR_RUNTIME, "decode: no buffer for the logits");
    if (st == CTRL_OK && !be->host_memory) {
        st = model_grow(m, (void **)&m->dec_logits, &m->dec_logits_bytes, sizeof(float) * (size_t)rows * V);
        lg = m->dec_logits;
    }
    if (st != CTRL_OK) {
        free(ints);
        return st;
    }
    /* the layer code reads m->T, m->batch, m->dev_batch, m->acts and writes the last layer into
     * m->x_out: point them at the decode scratch for this call, and give the training state back after */
    const int saved_T = m->T;
    const ctrl_batch saved_batch = m->batch, saved_dev_batch = m->dev_batch;
    layer_acts *saved_acts = m->acts;
    float *saved_out = m->x_out;
    m->T = T, m->acts = m->dec_acts, m->x_out = m->dec_out;
    m->batch = (ctrl_batch){.T = T, .B = n_seq, .tokens = tokens, .positions = m->dec_pos};
    m->dev_batch = (ctrl_batch){.T = T, .B = n_seq, .tokens = d_ints, .positions = d_ints + T};
    decode_ctx d = {.c = c,
                    .n_seq = n_seq,
                    .max_pos = max_pos - 1,
                    .seq_of = d_ints + 2 * (size_t)T,
                    .slots = d_ints + 3 * (size_t)T,
                    .block_tables = d_ints + 4 * (size_t)T,
                    .max_blocks = max_blocks};
    m->dec_n_new = n_new, m->dec_n_seq = n_seq; /* the adapters' runs (lora_bank.c) */
    if (packed) st = model_pack_begin(m);
    /* ZeRO-3: the hook gathers the embeddings (layer n_layers) and the head (n_layers + 1, or
     * n_layers tied) around their use as it does the layers */
    if (st == CTRL_OK && m->dec_hook) st = m->dec_hook(m->dec_hook_ctx, model_outer_slot(m, 0), 0);
    if (st == CTRL_OK) st = model_embed_lookup(m, m->acts[0].x_in, m->dev_batch.tokens, T, C);
    if (st == CTRL_OK && cfg->embed_scale > 0)
        st = be->scale(m->acts[0].x_in, cfg->embed_scale, (int64_t)T * C);
    if (st == CTRL_OK && m->dec_hook) st = m->dec_hook(m->dec_hook_ctx, model_outer_slot(m, 0), 1);
    for (int l = 0; l < cfg->n_layers && st == CTRL_OK; l++) {
        if (m->dec_hook) st = m->dec_hook(m->dec_hook_ctx, l, 0); /* ZeRO-3: the layer gathered */
        if (st == CTRL_OK)
            st = model_layer_forward(m, l, l + 1 < cfg->n_layers ? m->acts[l + 1].x_in : m->x_out,
                                     paged_attention, &d);
        if (st == CTRL_OK && m->dec_hook) st = m->dec_hook(m->dec_hook_ctx, l, 1); /* and released */
    }
    if (st == CTRL_OK) { /* each sequence's last new token (or every one) through the head */
        if (all_rows) st = be->copy(m->dec_hin, m->x_out, sizeof(float) * (size_t)T * C);
        /* each sequence's last new token's row: consecutive rows in one copy (a decoding step, one
         * new token per sequence, is a single copy) */
        for (int s = 0, t = 0; s < n_seq && st == CTRL_OK && !all_rows;) {
            t += n_new[s];
            const int first = t - 1, s0 = s++;
            while (s < n_seq && n_new[s] == 1) t++, s++; /* their rows follow: first + 1, ... */
            st = be->copy(m->dec_hin + (size_t)s0 * C, m->x_out + (size_t)first * C,
                          sizeof(float) * (size_t)(s - s0) * C);
        }
        if (st == CTRL_OK)
            st = model_norm_forward(m, m->dec_h, m->dec_rstd, m->dec_hin, m->dparams + m->off_norm, rows, C);
        if (st == CTRL_OK && m->dec_hook) st = m->dec_hook(m->dec_hook_ctx, model_outer_slot(m, 1), 0);
        /* the head in bf16 too: its panels (decoding's or held), or a bf16 table */
        if (st == CTRL_OK && (packed || ctrl_model_embedding_held_bf16(m) || m->head_held_only))
            st = model_linear_forward(m, lg, m->dec_h, m->dparams + m->off_lm_head, NULL, rows, C, V);
        else if (st == CTRL_OK)
            st = be->linear_forward(lg, m->dec_h, m->dparams + m->off_lm_head, NULL, rows, C, V);
        if (st == CTRL_OK && m->dec_hook) st = m->dec_hook(m->dec_hook_ctx, model_outer_slot(m, 1), 1);
        /* logits == NULL: they stay on the device (ctrl_model_decode_logits), not yet soft-capped */
        if (st == CTRL_OK && logits && lg != logits)
            st = be->to_host(logits, lg, sizeof(float) * (size_t)rows * V);
        const float cap = cfg->final_softcap; /* on the host: logits are the caller's buffer */
        for (size_t i = 0; st == CTRL_OK && logits && cap > 0 && i < (size_t)rows * V; i++)
            logits[i] = cap * tanhf(logits[i] / cap);
        for (int s = 0; st == CTRL_OK && s < n_seq; s++) seqs[s]->len += n_new[s];
    }
    m->T = saved_T, m->batch = saved_batch, m->dev_batch = saved_dev_batch, m->acts = saved_acts,
    m->x_out = saved_out;
    m->dec_adapters = NULL, m->dec_n_new = NULL, m->dec_n_seq = 0; /* for this call only */
    m->dec_pack_on = 0;
    free(ints);
    return st;
}

ctrl_status ctrl_model_decode(ctrl_model *m, ctrl_kv_cache *c, ctrl_kv_seq *const *seqs,
                              const int32_t *tokens, const int *n_new, int n_seq, float *logits) {
    ctrl_status st = decode(m, c, seqs, tokens, n_new, n_seq, logits, 0);
    m->dec_adapters = NULL; /* ctrl_model_set_decode_adapters holds for one call, failed or not */
    return st;
}

ctrl_status ctrl_model_decode_all(ctrl_model *m, ctrl_kv_cache *c, ctrl_kv_seq *seq, const int32_t *tokens,
                                  int n, float *logits) {
    ctrl_kv_seq *const seqs[1] = {seq};
    ctrl_status st = decode(m, c, seqs, tokens, &n, 1, logits, 1);
    m->dec_adapters = NULL;
    return st;
}

const float *ctrl_model_decode_logits(const ctrl_model *m) { return m->dec_logits; }

void ctrl_model_set_decode_hook(ctrl_model *m, ctrl_model_layer_hook fn, void *ctx) {
    m->dec_hook = fn, m->dec_hook_ctx = ctx;
}
