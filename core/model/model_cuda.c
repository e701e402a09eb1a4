/* See model_cuda.h. Offsets of each tensor come from the host model's named views, so both
 * sides share one layout. */
#include "model/model_cuda.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_ops.h"

#ifdef CTRL_HAVE_CUDA

typedef struct dev_layer {
    long ln1, wq, bq, wk, bk, wv, bv, wo, q_norm, k_norm, ln2, wg, wu, wd;
    float *x_in, *ln1_out, *rstd1, *q_raw, *k_raw, *q_rstd, *k_rstd, *q, *k, *v, *att, *lse, *x_mid, *ln2_out,
        *rstd2, *g, *u, *h;
} dev_layer;

struct ctrl_model_cuda {
    ctrl_model *host;
    ctrl_model_config cfg;
    const ctrl_attention_ops *attn;
    float *params, *grads;
    size_t n_params;
    long off_embed, off_norm, off_lm_head;
    dev_layer *L;
    float *cos_tab, *sin_tab;
    int rope_len;
    int T, cap_T, B;
    float *act_mem;
    float *x_out, *lnf, *rstdf, *head_lse, *head_ent;
    int32_t *tokens, *positions, *targets, *cu;
    int32_t *cu_host;
    void *head_ws;
    size_t head_ws_bytes;
};

static long off(ctrl_model *m, const char *fmt, int l) {
    char name[128];
    snprintf(name, sizeof name, fmt, l);
    const ctrl_param_view *v = ctrl_model_find_view(m, name);
    return v ? (long)v->offset : -1;
}

ctrl_status ctrl_model_cuda_create(ctrl_model *m, const ctrl_attention_ops *attn, ctrl_model_cuda **out) {
    *out = NULL;
    if (ctrl_cuda_device_count() == 0)
        return ctrl_error_set(CTRL_ERR_DEVICE, "model on cuda: %s", ctrl_cuda_unavailable_reason());
    ctrl_model_cuda *d = calloc(1, sizeof *d);
    d->host = m;
    d->cfg = *ctrl_model_cfg(m);
    d->attn = attn;
    const ctrl_model_config *c = &d->cfg;
    d->L = calloc((size_t)c->n_layers, sizeof *d->L);
    for (int l = 0; l < c->n_layers; l++) {
        dev_layer *x = &d->L[l];
        x->ln1 = off(m, "model.layers.%d.input_layernorm.weight", l);
        x->wq = off(m, "model.layers.%d.self_attn.q_proj.weight", l),
        x->bq = off(m, "model.layers.%d.self_attn.q_proj.bias", l);
        x->wk = off(m, "model.layers.%d.self_attn.k_proj.weight", l),
        x->bk = off(m, "model.layers.%d.self_attn.k_proj.bias", l);
        x->wv = off(m, "model.layers.%d.self_attn.v_proj.weight", l),
        x->bv = off(m, "model.layers.%d.self_attn.v_proj.bias", l);
        x->wo = off(m, "model.layers.%d.self_attn.o_proj.weight", l);
        x->q_norm = off(m, "model.layers.%d.self_attn.q_norm.weight", l);
        x->k_norm = off(m, "model.layers.%d.self_attn.k_norm.weight", l);
        x->ln2 = off(m, "model.layers.%d.post_attention_layernorm.weight", l);
        x->wg = off(m, "model.layers.%d.mlp.gate_proj.weight", l),
        x->wu = off(m, "model.layers.%d.mlp.up_proj.weight", l);
        x->wd = off(m, "model.layers.%d.mlp.down_proj.weight", l);
    }
    d->off_embed = off(m, "model.embed_tokens.weight", 0);
    d->off_norm = off(m, "model.norm.weight", 0);
    d->off_lm_head = c->tie_word_embeddings ? d->off_embed : off(m, "lm_head.weight", 0);
    float *hp = ctrl_model_params(m, &d->n_params);
    ctrl_status st = ctrl_cuda_malloc((void **)&d->params, d->n_params * 4);
    if (st == CTRL_OK) st = ctrl_cuda_malloc((void **)&d->grads, d->n_params * 4);
    if (st == CTRL_OK) st = ctrl_cuda_memcpy_h2d(d->params, hp, d->n_params * 4);
    if (st == CTRL_OK) st = ctrl_cuda_memset(d->grads, 0, d->n_params * 4);
    if (st != CTRL_OK) {
        ctrl_model_cuda_free(d);
        return st;
    }
    *out = d;
    return CTRL_OK;
}

void ctrl_model_cuda_free(ctrl_model_cuda *d) {
    if (!d) return;
    ctrl_cuda_free(d->params), ctrl_cuda_free(d->grads), ctrl_cuda_free(d->act_mem),
        ctrl_cuda_free(d->cos_tab);
    ctrl_cuda_free(d->sin_tab), ctrl_cuda_free(d->tokens), ctrl_cuda_free(d->head_ws);
    free(d->cu_host), free(d->L), free(d);
}

ctrl_status ctrl_model_cuda_zero_grad(ctrl_model_cuda *d) {
    return ctrl_cuda_memset(d->grads, 0, d->n_params * 4);
}

ctrl_status ctrl_model_cuda_grads_to_host(ctrl_model_cuda *d, float *dst) {
    return ctrl_cuda_memcpy_d2h(dst, d->grads, d->n_params * 4);
}

ctrl_status ctrl_model_cuda_params_from_host(ctrl_model_cuda *d) {
    return ctrl_cuda_memcpy_h2d(d->params, ctrl_model_params(d->host, NULL), d->n_params * 4);
}

static ctrl_status ensure(ctrl_model_cuda *d, const ctrl_batch *b) {
    const ctrl_model_config *c = &d->cfg;
    ctrl_status st = CTRL_OK;
    int max_pos = 0;
    for (int i = 0; i < b->T; i++) max_pos = b->positions[i] > max_pos ? b->positions[i] : max_pos;
    if (max_pos + 1 > d->rope_len) {
        int len = 256;
        while (len < max_pos + 1) len *= 2;
        const size_t half = (size_t)c->head_dim / 2;
        float *ct = malloc(sizeof(float) * len * half), *stab = malloc(sizeof(float) * len * half);
        ctrl_cpu_rope_tables(ct, stab, len, c->head_dim, &c->rope);
        ctrl_cuda_free(d->cos_tab), ctrl_cuda_free(d->sin_tab);
        st = ctrl_cuda_malloc((void **)&d->cos_tab, sizeof(float) * len * half);
        if (st == CTRL_OK) st = ctrl_cuda_malloc((void **)&d->sin_tab, sizeof(float) * len * half);
        if (st == CTRL_OK) st = ctrl_cuda_memcpy_h2d(d->cos_tab, ct, sizeof(float) * len * half);
        if (st == CTRL_OK) st = ctrl_cuda_memcpy_h2d(d->sin_tab, stab, sizeof(float) * len * half);
        free(ct), free(stab);
        if (st != CTRL_OK) return st;
        d->rope_len = len;
    }
    if (b->T > d->cap_T) {
        const size_t C = c->hidden_size, I = c->intermediate_size, QD = (size_t)c->n_heads * c->head_dim,
                     KD = (size_t)c->n_kv_heads * c->head_dim, H = c->n_heads, HK = c->n_kv_heads;
        const size_t per_layer = 4 * C + 2 + 3 * QD + 3 * KD + 2 * H + HK + 3 * I, top = 2 * C + 3;
        const size_t T = (size_t)b->T;
        ctrl_cuda_free(d->act_mem);
        if ((st =
                 ctrl_cuda_malloc((void **)&d->act_mem, sizeof(float) * T * (per_layer * c->n_layers + top))))
            return st;
        float *p = d->act_mem;
#define TAKE(n) (p += T * (n), p - T * (n))
        for (int l = 0; l < c->n_layers; l++) {
            dev_layer *a = &d->L[l];
            a->x_in = TAKE(C), a->ln1_out = TAKE(C), a->rstd1 = TAKE(1), a->q_raw = TAKE(QD),
            a->k_raw = TAKE(KD);
            a->q_rstd = TAKE(H), a->k_rstd = TAKE(HK), a->q = TAKE(QD), a->k = TAKE(KD), a->v = TAKE(KD);
            a->att = TAKE(QD), a->lse = TAKE(H), a->x_mid = TAKE(C), a->ln2_out = TAKE(C), a->rstd2 = TAKE(1);
            a->g = TAKE(I), a->u = TAKE(I), a->h = TAKE(I);
        }
        d->x_out = TAKE(C), d->lnf = TAKE(C), d->rstdf = TAKE(1), d->head_lse = TAKE(1),
        d->head_ent = TAKE(1);
#undef TAKE
        ctrl_cuda_free(d->tokens);
        if ((st = ctrl_cuda_malloc((void **)&d->tokens, sizeof(int32_t) * (3 * T + T + 1)))) return st;
        d->cap_T = b->T;
    }
    d->positions = d->tokens + b->T, d->targets = d->positions + b->T, d->cu = d->targets + b->T;
    if ((st = ctrl_cuda_memcpy_h2d(d->tokens, b->tokens, 4 * (size_t)b->T)) ||
        (st = ctrl_cuda_memcpy_h2d(d->positions, b->positions, 4 * (size_t)b->T)) ||
        (st = ctrl_cuda_memcpy_h2d(d->targets, b->targets, 4 * (size_t)b->T)) ||
        (st = ctrl_cuda_memcpy_h2d(d->cu, b->cu_seqlens, 4 * (size_t)(b->B + 1))))
        return st;
    free(d->cu_host);
    d->cu_host = malloc(4 * (size_t)(b->B + 1));
    memcpy(d->cu_host, b->cu_seqlens, 4 * (size_t)(b->B + 1));
    ctrl_head_args ha = {.T = b->T, .C = c->hidden_size, .V = c->vocab_size, .temperature = 1.0f};
    size_t ws = ctrl_cuda_head_workspace_bytes(&ha);
    if (ws > d->head_ws_bytes) {
        ctrl_cuda_free(d->head_ws);
        if ((st = ctrl_cuda_malloc(&d->head_ws, ws))) return st;
        d->head_ws_bytes = ws;
    }
    d->T = b->T, d->B = b->B;
    return CTRL_OK;
}

static ctrl_attention_args attn_args(const ctrl_model_cuda *d, dev_layer *a) {
    const ctrl_model_config *c = &d->cfg;
    ctrl_attention_args args = {.size = sizeof args,
                                .device = {CTRL_DEVICE_CUDA, 0},
                                .dtype = CTRL_F32,
                                .n_seqs = d->B,
                                .cu_seqlens = d->cu,
                                .cu_seqlens_host = d->cu_host,
                                .total_tokens = d->T,
                                .n_head = c->n_heads,
                                .n_kv_head = c->n_kv_heads,
                                .head_dim = c->head_dim,
                                .scale = 1.0f / sqrtf((float)c->head_dim),
                                .causal = 1,
                                .window = c->sliding_window,
                                .q = a->q,
                                .k = a->k,
                                .v = a->v,
                                .out = a->att,
                                .lse = a->lse};
    return args;
}

#define TRY(call)                                                                                            \
    do {                                                                                                     \
        ctrl_status s_ = (call);                                                                             \
        if (s_ != CTRL_OK) return s_;                                                                        \
    } while (0)

ctrl_status ctrl_model_cuda_forward(ctrl_model_cuda *d, const ctrl_batch *b, float *logp, float *entropy,
                                    int32_t *correct) {
    const ctrl_model_config *c = &d->cfg;
    TRY(ensure(d, b));
    const int T = b->T, C = c->hidden_size, I = c->intermediate_size, H = c->n_heads, HK = c->n_kv_heads,
              D = c->head_dim;
    const float eps = c->rms_norm_eps, *P = d->params;
    TRY(ctrl_cuda_embedding_forward(d->L[0].x_in, d->tokens, P + d->off_embed, T, C));
    for (int l = 0; l < c->n_layers; l++) {
        dev_layer *a = &d->L[l];
        float *next = l + 1 < c->n_layers ? d->L[l + 1].x_in : d->x_out;
        TRY(ctrl_cuda_rmsnorm_forward(a->ln1_out, a->rstd1, a->x_in, P + a->ln1, T, C, eps));
        TRY(ctrl_cuda_linear_forward_f32(a->q_raw, a->ln1_out, P + a->wq, a->bq >= 0 ? P + a->bq : NULL, T, C,
                                         H * D));
        TRY(ctrl_cuda_linear_forward_f32(a->k_raw, a->ln1_out, P + a->wk, a->bk >= 0 ? P + a->bk : NULL, T, C,
                                         HK * D));
        TRY(ctrl_cuda_linear_forward_f32(a->v, a->ln1_out, P + a->wv, a->bv >= 0 ? P + a->bv : NULL, T, C,
                                         HK * D));
        const float *qin = a->q_raw, *kin = a->k_raw;
        if (c->qk_norm) {
            TRY(ctrl_cuda_rmsnorm_forward(a->q, a->q_rstd, a->q_raw, P + a->q_norm, T * H, D, eps));
            TRY(ctrl_cuda_rmsnorm_forward(a->k, a->k_rstd, a->k_raw, P + a->k_norm, T * HK, D, eps));
            qin = a->q, kin = a->k;
        }
        TRY(ctrl_cuda_rope_forward(a->q, qin, d->positions, d->cos_tab, d->sin_tab, T, H, D));
        TRY(ctrl_cuda_rope_forward(a->k, kin, d->positions, d->cos_tab, d->sin_tab, T, HK, D));
        ctrl_attention_args args = attn_args(d, a);
        TRY(d->attn->forward(&args, NULL));
        TRY(ctrl_cuda_linear_forward_f32(a->x_mid, a->att, P + a->wo, NULL, T, H * D, C));
        TRY(ctrl_cuda_residual_forward(a->x_mid, a->x_mid, a->x_in, (int64_t)T * C));
        TRY(ctrl_cuda_rmsnorm_forward(a->ln2_out, a->rstd2, a->x_mid, P + a->ln2, T, C, eps));
        TRY(ctrl_cuda_linear_forward_f32(a->g, a->ln2_out, P + a->wg, NULL, T, C, I));
        TRY(ctrl_cuda_linear_forward_f32(a->u, a->ln2_out, P + a->wu, NULL, T, C, I));
        TRY(ctrl_cuda_swiglu_forward(a->h, a->g, a->u, (int64_t)T * I));
        TRY(ctrl_cuda_linear_forward_f32(next, a->h, P + a->wd, NULL, T, I, C));
        TRY(ctrl_cuda_residual_forward(next, next, a->x_mid, (int64_t)T * C));
    }
    TRY(ctrl_cuda_rmsnorm_forward(d->lnf, d->rstdf, d->x_out, P + d->off_norm, T, C, eps));
    ctrl_head_args ha = {.hidden = d->lnf,
                         .w = P + d->off_lm_head,
                         .targets = d->targets,
                         .T = T,
                         .C = C,
                         .V = c->vocab_size,
                         .temperature = 1.0f};
    float *dlogp;
    int32_t *dok = NULL;
    TRY(ctrl_cuda_malloc((void **)&dlogp, sizeof(float) * T));
    if (correct) TRY(ctrl_cuda_malloc((void **)&dok, sizeof(int32_t) * T));
    ctrl_status st = ctrl_cuda_head_forward(&ha, dlogp, d->head_ent, d->head_lse, dok, d->head_ws);
    if (st == CTRL_OK) st = ctrl_cuda_memcpy_d2h(logp, dlogp, sizeof(float) * T);
    if (st == CTRL_OK && correct) st = ctrl_cuda_memcpy_d2h(correct, dok, sizeof(int32_t) * T);
    if (st == CTRL_OK && entropy) st = ctrl_cuda_memcpy_d2h(entropy, d->head_ent, sizeof(float) * T);
    ctrl_cuda_free(dlogp), ctrl_cuda_free(dok);
    return st;
}

ctrl_status ctrl_model_cuda_backward(ctrl_model_cuda *d, const float *dlogp_host) {
    const ctrl_model_config *c = &d->cfg;
    const int T = d->T, C = c->hidden_size, I = c->intermediate_size, H = c->n_heads, HK = c->n_kv_heads,
              D = c->head_dim;
    const float *P = d->params;
    float *G = d->grads;
    const size_t wide = (size_t)T * (I > H * D ? I : H * D);
    float *dres, *dtmp, *d1, *d2, *d3, *dk, *dv, *dlogp;
    TRY(ctrl_cuda_malloc((void **)&dres, sizeof(float) * T * C));
    TRY(ctrl_cuda_malloc((void **)&dtmp, sizeof(float) * T * C));
    TRY(ctrl_cuda_malloc((void **)&d1, sizeof(float) * wide));
    TRY(ctrl_cuda_malloc((void **)&d2, sizeof(float) * wide));
    TRY(ctrl_cuda_malloc((void **)&d3, sizeof(float) * wide));
    TRY(ctrl_cuda_malloc((void **)&dk, sizeof(float) * T * HK * D));
    TRY(ctrl_cuda_malloc((void **)&dv, sizeof(float) * T * HK * D));
    TRY(ctrl_cuda_malloc((void **)&dlogp, sizeof(float) * T));
    ctrl_status st = ctrl_cuda_memcpy_h2d(dlogp, dlogp_host, sizeof(float) * T);
    ctrl_head_args ha = {.hidden = d->lnf,
                         .w = P + d->off_lm_head,
                         .targets = d->targets,
                         .T = T,
                         .C = C,
                         .V = c->vocab_size,
                         .temperature = 1.0f};
#define STEP(call)                                                                                           \
    if (st == CTRL_OK) st = (call)
    STEP(ctrl_cuda_head_backward(&ha, d->head_lse, dlogp, NULL, NULL, dtmp, G + d->off_lm_head, d->head_ws));
    STEP(ctrl_cuda_rmsnorm_backward(dres, G + d->off_norm, dtmp, d->x_out, P + d->off_norm, d->rstdf, T, C));
    for (int l = c->n_layers - 1; l >= 0 && st == CTRL_OK; l--) {
        dev_layer *a = &d->L[l];
        STEP(ctrl_cuda_linear_backward_f32(d1, G + a->wd, NULL, dres, a->h, P + a->wd, T, I, C));
        STEP(ctrl_cuda_swiglu_backward(d2, d3, d1, a->g, a->u, (int64_t)T * I));
        STEP(ctrl_cuda_linear_backward_f32(dtmp, G + a->wg, NULL, d2, a->ln2_out, P + a->wg, T, C, I));
        STEP(ctrl_cuda_linear_backward_f32(d1, G + a->wu, NULL, d3, a->ln2_out, P + a->wu, T, C, I));
        STEP(ctrl_cuda_residual_forward(dtmp, dtmp, d1, (int64_t)T * C));
        STEP(ctrl_cuda_rmsnorm_backward(d1, G + a->ln2, dtmp, a->x_mid, P + a->ln2, a->rstd2, T, C));
        STEP(ctrl_cuda_residual_forward(dres, dres, d1, (int64_t)T * C));
        STEP(ctrl_cuda_linear_backward_f32(d1, G + a->wo, NULL, dres, a->att, P + a->wo, T, H * D, C));
        ctrl_attention_args args = attn_args(d, a);
        args.dout = d1, args.dq = d2, args.dk = dk, args.dv = dv;
        STEP(d->attn->backward(&args, NULL));
        STEP(ctrl_cuda_rope_backward(d2, d2, d->positions, d->cos_tab, d->sin_tab, T, H, D));
        STEP(ctrl_cuda_rope_backward(dk, dk, d->positions, d->cos_tab, d->sin_tab, T, HK, D));
        if (c->qk_norm) {
            STEP(ctrl_cuda_rmsnorm_backward(d3, G + a->q_norm, d2, a->q_raw, P + a->q_norm, a->q_rstd, T * H,
                                            D));
            STEP(ctrl_cuda_memcpy_d2d(d2, d3, sizeof(float) * T * H * D));
            STEP(ctrl_cuda_rmsnorm_backward(d3, G + a->k_norm, dk, a->k_raw, P + a->k_norm, a->k_rstd, T * HK,
                                            D));
            STEP(ctrl_cuda_memcpy_d2d(dk, d3, sizeof(float) * T * HK * D));
        }
        STEP(ctrl_cuda_linear_backward_f32(dtmp, G + a->wq, a->bq >= 0 ? G + a->bq : NULL, d2, a->ln1_out,
                                           P + a->wq, T, C, H * D));
        STEP(ctrl_cuda_linear_backward_f32(d1, G + a->wk, a->bk >= 0 ? G + a->bk : NULL, dk, a->ln1_out,
                                           P + a->wk, T, C, HK * D));
        STEP(ctrl_cuda_residual_forward(dtmp, dtmp, d1, (int64_t)T * C));
        STEP(ctrl_cuda_linear_backward_f32(d1, G + a->wv, a->bv >= 0 ? G + a->bv : NULL, dv, a->ln1_out,
                                           P + a->wv, T, C, HK * D));
        STEP(ctrl_cuda_residual_forward(dtmp, dtmp, d1, (int64_t)T * C));
        STEP(ctrl_cuda_rmsnorm_backward(d1, G + a->ln1, dtmp, a->x_in, P + a->ln1, a->rstd1, T, C));
        STEP(ctrl_cuda_residual_forward(dres, dres, d1, (int64_t)T * C));
    }
    STEP(ctrl_cuda_embedding_backward(G + d->off_embed, dres, d->tokens, T, C));
    STEP(ctrl_cuda_synchronize());
#undef STEP
    ctrl_cuda_free(dres), ctrl_cuda_free(dtmp), ctrl_cuda_free(d1), ctrl_cuda_free(d2), ctrl_cuda_free(d3);
    ctrl_cuda_free(dk), ctrl_cuda_free(dv), ctrl_cuda_free(dlogp);
    return st;
}

#else /* built without CUDA */

ctrl_status ctrl_model_cuda_create(ctrl_model *m, const ctrl_attention_ops *attn, ctrl_model_cuda **out) {
    (void)m, (void)attn;
    *out = NULL;
    return ctrl_error_set(CTRL_ERR_UNSUPPORTED, "model on cuda: this ctrl was built without CUDA");
}
void ctrl_model_cuda_free(ctrl_model_cuda *d) { (void)d; }
ctrl_status ctrl_model_cuda_forward(ctrl_model_cuda *d, const ctrl_batch *b, float *logp, float *entropy,
                                    int32_t *correct) {
    (void)d, (void)b, (void)logp, (void)entropy, (void)correct;
    return CTRL_ERR_UNSUPPORTED;
}
ctrl_status ctrl_model_cuda_params_from_host(ctrl_model_cuda *d) {
    (void)d;
    return CTRL_ERR_UNSUPPORTED;
}
ctrl_status ctrl_model_cuda_backward(ctrl_model_cuda *d, const float *dlogp) {
    (void)d, (void)dlogp;
    return CTRL_ERR_UNSUPPORTED;
}
ctrl_status ctrl_model_cuda_zero_grad(ctrl_model_cuda *d) {
    (void)d;
    return CTRL_ERR_UNSUPPORTED;
}
ctrl_status ctrl_model_cuda_grads_to_host(ctrl_model_cuda *d, float *dst) {
    (void)d, (void)dst;
    return CTRL_ERR_UNSUPPORTED;
}

#endif
