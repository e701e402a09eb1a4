/* The model's compute dtype (see model.h): fp32, or bf16 as torch.autocast runs it — the linear
 * projections multiply bf16-rounded inputs by bf16-rounded weights with fp32 accumulation. Where
 * the products do not round the weights themselves at no cost (a CPU without AVX-512 BF16, CUDA),
 * the rounded weights are a copy kept beside the fp32 master weights and rebuilt only after they
 * change (ctrl_model_weights_changed), not in every projection: decoding runs the projections on a
 * handful of tokens per step, where rounding the weights each time would cost more than the GEMM.
 * On the CPU a forward of many tokens rounds them per projection instead (no copy: 4 bytes a
 * parameter less; the rounding is ~1/T of each product's work).
 * On a backend with 2-byte bf16 operands (backend.h's to_bf16 and linear_*_b16: CUDA) the copy is
 * held as bf16 values (wb16: 2 bytes a parameter, no conversion of w in any product, the LM head's
 * chunks included), and the activations that several products read -- ln1 by q, k and v, ln2 by
 * gate and up, and ln1, att, ln2 and h again by the weight gradients after a checkpointed layer's
 * recompute -- are converted once, as the forward writes them (model_act16_keep); a product's other
 * inputs and every dL/dout are converted once, in the product. CTRL_NO_BF16_OPERANDS=1 in the
 * environment turns this off (the products convert their operands, as before: for comparisons). */
#include <stdlib.h>

#include "cpu/cpu_ops.h"
#include "model/model_internal.h"

/* Forwards of at least this many tokens on the CPU round each projection's weights as they run
 * instead of keeping the rounded copy (model_prepare_weights). */
#define MODEL_BF16_COPY_MAX_T 64

ctrl_status ctrl_model_set_compute_dtype(ctrl_model *m, ctrl_dtype dtype) {
    if (dtype != CTRL_F32 && dtype != CTRL_BF16)
        return ctrl_error_set(CTRL_ERR_UNSUPPORTED,
                              "model: compute dtype %s is not supported on %s (fp32 or bf16)",
                              ctrl_dtype_name(dtype), m->be->name);
    if (dtype == CTRL_BF16 &&
        (!ctrl_backend_has(m->be, linear_forward_bf16) || !ctrl_backend_has(m->be, round_to_bf16)))
        return ctrl_error_set(CTRL_ERR_UNSUPPORTED, "model: bf16 compute is not implemented on %s yet",
                              m->be->name);
    if (dtype != CTRL_BF16 && ctrl_model_embedding_held_bf16(m)) /* fp32 lookups: the fp32 table is gone */
        return ctrl_error_set(
            CTRL_ERR_UNSUPPORTED,
            "model: the embedding is held in bf16 alone ([peft] embedding_dtype, or a "
            "checkpoint stored in bf16 loaded for bf16 inference): fp32 compute is refused");
    m->linear_bf16 = dtype == CTRL_BF16;
    m->rounded_valid = 0;
    return CTRL_OK;
}

ctrl_dtype ctrl_model_compute_dtype(const ctrl_model *m) { return m->linear_bf16 ? CTRL_BF16 : CTRL_F32; }

void ctrl_model_set_bf16_fallback(ctrl_model *m, ctrl_bf16_fallback fallback) {
    m->bf16_fp32 = fallback == CTRL_BF16_FALLBACK_FP32;
}

ctrl_bf16_fallback ctrl_model_bf16_fallback(const ctrl_model *m) {
    return m->bf16_fp32 ? CTRL_BF16_FALLBACK_FP32 : CTRL_BF16_FALLBACK_ROUNDED;
}

ctrl_status ctrl_model_set_compute_like(ctrl_model *m, const ctrl_model *like) {
    ctrl_model_set_bf16_fallback(m, ctrl_model_bf16_fallback(like));
    return ctrl_model_set_compute_dtype(m, ctrl_model_compute_dtype(like));
}

int model_bf16_as_fp32(const ctrl_model *m) {
    /* decoding (dec_n_new set for the call) keeps bf16's products: its AVX2 panels are a fast path */
    if (!m->linear_bf16 || !m->bf16_fp32 || m->dec_n_new) return 0;
    return ctrl_backend_has(m->be, bf16_kernel) && !m->be->bf16_kernel(1);
}

void ctrl_model_weights_changed(ctrl_model *m) {
    m->rounded_valid = 0;
    m->dec_pack_gen++; /* decoding's packed bf16 weights (model_decode_pack.c) are stale */
    m->dora_valid = 0;
    m->tt_valid = 0; /* trainable_token_indices' rows written into the table again */
    m->dparams_valid = m->dparams == m->params;
    m->host_stale = 0;
}

ctrl_status ctrl_model_set_round_skip(ctrl_model *m, const size_t *ranges, int n) {
    m->round_skip = n > 0 ? ranges : NULL, m->n_round_skip = n > 0 ? n : 0;
    return CTRL_OK;
}

ctrl_status ctrl_model_params_range_changed(ctrl_model *m, size_t off, size_t n) {
    if (n) m->dec_pack_gen++;
    /* trainable_token_indices' values among them (offload_optimizer's overlapped step uploads by ranges):
     * written into the tables again */
    lora_tokens_changed(m, off, n);
    if (!m->rounded_valid || !n) return CTRL_OK;
    if (m->wb16) return m->be->to_bf16(m->wb16 + off, m->dparams + off, (int64_t)n);
    return m->rounded ? m->be->round_to_bf16(m->rounded + off, m->dparams + off, (int64_t)n) : CTRL_OK;
}

/* Whether the products take 2-byte bf16 operands (backend.h's to_bf16 and linear_*_b16) for the
 * model's own weights: bf16 compute on such a backend, weights that are plain parameters (not NF4
 * slots, not a model held in bf16 or as panels). */
static int b16_products(const ctrl_model *m) {
    if (getenv("CTRL_NO_BF16_OPERANDS")) return 0; /* the per-product conversions instead (A/B) */
    return m->linear_bf16 && !m->be->host_memory && ctrl_backend_has(m->be, to_bf16) &&
           ctrl_backend_has(m->be, linear_forward_b16) && ctrl_backend_has(m->be, linear_backward_b16) &&
           !m->nf4_w && !m->w16 && !m->base_panels;
}

float *ctrl_model_bf16_copy(const ctrl_model *m) { return m->rounded; }

ctrl_status model_prepare_weights(ctrl_model *m, int T) {
    const size_t bytes = sizeof(float) * m->n_params;
    if (!m->dparams) /* ctrl_model_defer_device: ZeRO-3 has not put the slices there yet */
        return ctrl_error_set(CTRL_ERR_RUNTIME,
                              "model: a forward on %s before ZeRO-3 put its parameters there (the move "
                              "to the device was deferred)",
                              m->be->name);
    if (!m->dparams_valid) {
        ctrl_status st = m->be->to_device(m->dparams, m->params, bytes);
        if (st != CTRL_OK) return ctrl_error_wrap(st, "model: parameters onto %s", m->be->name);
        m->dparams_valid = 1;
        m->nf4_layer = -1; /* QLoRA: the device's slot now holds the host's, not a layer's */
        m->tt_state = 0;   /* the table's rows are the host's: trainable_token_indices' written again */
        lora_saved_uploaded(m);
    }
    MODEL_TRY(
        lora_saved_sync(m)); /* modules_to_save's tables: the base's values while the adapters are off */
    MODEL_TRY(lora_tokens_sync(m)); /* the table holds the rows computed with: trained, or the base's */
    /* no rounded copy where the backend's bf16 products round w themselves at no cost */
    const int rounds_itself = ctrl_backend_has(m->be, bf16_rounds_weights) && m->be->bf16_rounds_weights();
    /* nor on the CPU for a forward of many tokens (training, scoring, a prefill): each product
     * rounds its weights into a scratch the size of one projection as it runs (kernels/cpu/bf16.c),
     * a cost of about 1/T of the product's, instead of a copy of 4 bytes a parameter; decoding's
     * few-token forwards keep the copy, where rounding in every call would cost as much as the
     * product (a copy made for them is used by any forward while the weights stay as they are) */
    const int per_call = m->be->host_memory && T >= MODEL_BF16_COPY_MAX_T;
    /* nor for a model held in bf16 (model_bf16_store.c): its parameters are bf16 values, or panels;
     * nor for ZeRO-3's sliced device parameters (dbufs_external): a copy would be the whole model's,
     * and the layers gathered in bf16 hold bf16 values already (the products round the rest) */
    if (m->linear_bf16 && !m->rounded_valid && !rounds_itself && !per_call && !m->w16 && !m->base_panels &&
        !m->dbufs_external) {
        const int b16 = b16_products(m); /* the copy as 2-byte values (wb16), else fp32 (rounded) */
        if (b16 ? !m->wb16 : !m->rounded) {
            ctrl_status st = b16 ? m->be->alloc((void **)&m->wb16, sizeof(uint16_t) * m->n_params)
                                 : m->be->alloc((void **)&m->rounded, bytes);
            if (st != CTRL_OK)
                return ctrl_error_wrap(st, "model: the bf16 copy of %zu parameters", m->n_params);
        }
        if (!b16) m->be->free(m->wb16), m->wb16 = NULL;
        if (b16) m->be->free(m->rounded), m->rounded = NULL;
        ctrl_status st = CTRL_OK;
        for (int i = 0; i <= m->n_round_skip && st == CTRL_OK; i++) { /* the gaps between */
            const size_t a = i ? m->round_skip[2 * i - 1] : 0;
            const size_t b = i < m->n_round_skip ? m->round_skip[2 * i] : m->n_params;
            if (b > a)
                st = b16 ? m->be->to_bf16(m->wb16 + a, m->dparams + a, (int64_t)(b - a))
                         : m->be->round_to_bf16(m->rounded + a, m->dparams + a, (int64_t)(b - a));
        }
        m->rounded_valid = st == CTRL_OK;
        if (st != CTRL_OK) return st;
    }
    return dora_prepare(m); /* DoRA's weight norms, after the weights changed */
}

/* w (inside the parameters) as the projection multiplies it. */
static const float *as_multiplied(const ctrl_model *m, const float *w) {
    return m->rounded_valid && m->rounded ? m->rounded + (w - m->dparams) : w;
}

int ctrl_model_set_device_b16(ctrl_model *m, const uint16_t *b16, const size_t *ranges, int n) {
    m->ext_b16 = NULL, m->ext_ranges = NULL, m->n_ext = 0;
    const int dora = m->has_lora && m->lora && m->lora->use_dora; /* its norms read the fp32 base */
    if (!b16 || n <= 0 || !b16_products(m) || dora || m->cfg.n_experts > 0) return 0;
    m->ext_b16 = b16, m->ext_ranges = ranges, m->n_ext = n;
    return 1;
}

/* w's bf16 values where the model holds them (w inside the parameters): in wb16, or within a range
 * held outside (ctrl_model_set_device_b16); else NULL. */
static const uint16_t *held_b16(const ctrl_model *m, const float *w, int64_t n) {
    if (m->ext_b16) {
        if (w < m->dparams || w + n > m->dparams + m->n_params) return NULL;
        const size_t a = (size_t)(w - m->dparams);
        for (int i = 0; i < m->n_ext; i++)
            if (a >= m->ext_ranges[2 * i] && a + (size_t)n <= m->ext_ranges[2 * i + 1]) return m->ext_b16 + a;
        return NULL;
    }
    if (!m->wb16 || !m->rounded_valid || w < m->dparams || w + n > m->dparams + m->n_params) return NULL;
    return m->wb16 + (w - m->dparams);
}

const uint16_t *model_head_w16(const ctrl_model *m) {
    const int64_t n = (int64_t)m->cfg.vocab_size * m->cfg.hidden_size;
    return m->linear_bf16 && m->off_lm_head >= 0 ? held_b16(m, m->dparams + m->off_lm_head, n) : NULL;
}

ctrl_status model_act16_keep(ctrl_model *m, int slot, const float *x, int64_t n) {
    struct model_act16 *s = &m->act16[slot];
    s->src = NULL;
    if (!m->wb16 || !m->rounded_valid || !b16_products(m)) return CTRL_OK;
    MODEL_TRY(model_grow(m, (void **)&s->buf, &s->cap, sizeof(uint16_t) * (size_t)n));
    MODEL_TRY(m->be->to_bf16(s->buf, x, n));
    s->src = x, s->n = n;
    return CTRL_OK;
}

void model_act16_clear(ctrl_model *m) {
    for (int i = 0; i < 4; i++) m->act16[i].src = NULL;
}

void model_act16_release(ctrl_model *m) {
    for (int i = 0; i < 4; i++) {
        m->be->free(m->act16[i].buf);
        m->act16[i] = (struct model_act16){0};
    }
}

/* x [n] in bf16: a kept copy (model_act16_keep), else converted into *tmp (backend memory the caller
 * frees). NULL x: none. */
static ctrl_status act_b16(const ctrl_model *m, const float *x, int64_t n, const uint16_t **out,
                           uint16_t **tmp) {
    *out = NULL, *tmp = NULL;
    if (!x) return CTRL_OK;
    for (int i = 0; i < 4; i++)
        if (m->act16[i].src == x && m->act16[i].n == n) return *out = m->act16[i].buf, CTRL_OK;
    MODEL_TRY(m->be->alloc((void **)tmp, sizeof(uint16_t) * (size_t)(n > 0 ? n : 1)));
    *out = *tmp;
    return m->be->to_bf16(*tmp, x, n);
}

/* The LM head tied to an embedding held in bf16 alone (model_embed16.c): x W^T and dX = dY W on it, as
 * the bf16 products multiply W's rounded values (the table is frozen: no dW). */
static ctrl_status embed16_forward(const ctrl_model *m, float *out, const float *x, const float *bias, int T,
                                   int OUT) {
    const int bf16 = m->linear_bf16 && !model_bf16_as_fp32(m); /* x rounded, as W's values are */
    MODEL_TRY(model_embed16_forward(m, out, OUT, x, T, 0, OUT, bf16));
    for (int t = 0; bias && t < T; t++)
        for (int j = 0; j < OUT; j++) out[(size_t)t * OUT + j] += bias[j];
    return CTRL_OK;
}

static ctrl_status embed16_backward(const ctrl_model *m, float *dx, float *dw, float *dbias,
                                    const float *dout, int T) {
    if (dw || dbias)
        return ctrl_error_set(CTRL_ERR_RUNTIME,
                              "model: a gradient for the embedding held in bf16 (it is frozen)");
    return dx ? model_embed16_backward(m, dx, dout, T, m->linear_bf16 && !model_bf16_as_fp32(m)) : CTRL_OK;
}

ctrl_status model_linear_forward(const ctrl_model *m, float *out, const float *x, const float *w,
                                 const float *bias, int T, int IN, int OUT) {
    if (model_embed16_holds(m, w)) return embed16_forward(m, out, x, bias, T, OUT);
    if (nf4_holds(m, w)) return nf4_linear_forward(m, out, x, w, bias, T, IN, OUT); /* QLoRA's base */
    if (!m->linear_bf16) return m->be->linear_forward(out, x, w, bias, T, IN, OUT);
    if (m->dec_pack) { /* panels (model_decode_pack.c): decoding's, current ones, a held base */
        int used = 0;
        ctrl_status st = model_pack_linear(m, out, x, w, bias, T, IN, OUT, &used);
        if (st != CTRL_OK || used) return st;
    }
    /* no bf16 kernel here and the fallback is fp32: w as it is (bf16 values where the model holds
     * them so), x unrounded */
    if (model_bf16_as_fp32(m)) return m->be->linear_forward(out, x, w, bias, T, IN, OUT);
    const uint16_t *w16 = held_b16(m, w, (int64_t)OUT * IN);
    if (w16) { /* 2-byte operands: w held, x kept or converted once here */
        const uint16_t *x16;
        uint16_t *tmp;
        ctrl_status st = act_b16(m, x, (int64_t)T * IN, &x16, &tmp);
        if (st == CTRL_OK) st = m->be->linear_forward_b16(out, x16, w16, bias, T, IN, OUT);
        m->be->free(tmp);
        return st;
    }
    return m->be->linear_forward_bf16(out, x, as_multiplied(m, w), bias, T, IN, OUT,
                                      m->rounded_valid || model_bf16_holds(m, w));
}

ctrl_status model_linear_backward(const ctrl_model *m, float *dx, float *dw, float *dbias, const float *dout,
                                  const float *x, const float *w, int T, int IN, int OUT) {
    if (model_embed16_holds(m, w)) return embed16_backward(m, dx, dw, dbias, dout, T);
    if (nf4_holds(m, w)) return nf4_linear_backward(m, dx, dw, dbias, dout, w, T, IN, OUT);
    if (!m->linear_bf16) return m->be->linear_backward(dx, dw, dbias, dout, x, w, T, IN, OUT);
    if (m->dec_pack) { /* dx on the forward's panels, read transposed (model_decode_pack.c) */
        int used = 0;
        ctrl_status st = model_pack_linear_backward(m, dx, dw, dbias, dout, x, w, T, IN, OUT, &used);
        if (st != CTRL_OK || used) return st;
    }
    if (model_bf16_as_fp32(m)) return m->be->linear_backward(dx, dw, dbias, dout, x, w, T, IN, OUT);
    const uint16_t *w16 = held_b16(m, w, (int64_t)OUT * IN);
    if (w16) { /* dL/dout converted once for dx and dw; x kept or converted */
        const uint16_t *d16, *x16 = NULL;
        uint16_t *dtmp, *xtmp = NULL;
        ctrl_status st = act_b16(m, dout, (int64_t)T * OUT, &d16, &dtmp);
        if (st == CTRL_OK && dw) st = act_b16(m, x, (int64_t)T * IN, &x16, &xtmp);
        if (st == CTRL_OK) st = m->be->linear_backward_b16(dx, dw, dbias, d16, dout, x16, w16, T, IN, OUT);
        m->be->free(dtmp), m->be->free(xtmp);
        return st;
    }
    return m->be->linear_backward_bf16(dx, dw, dbias, dout, x, as_multiplied(m, w), T, IN, OUT,
                                       m->rounded_valid || model_bf16_holds(m, w));
}
