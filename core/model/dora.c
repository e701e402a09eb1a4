/* DoRA (use_dora: weight-decomposed LoRA, huggingface/peft tuners/lora/dora.py) on a linear layer
 * y = x W^T + b with an adapter A [r, IN], B [OUT, r], scaling s and a trainable magnitude m [OUT]:
 *     n   = || W + s B A ||  per output row, treated as a constant (PEFT detaches it, as the DoRA
 *           paper's section 4.3 suggests: no gradient flows through the norm)
 *     g   = m / n
 *     y   = x W^T + b + (g - 1) * (x' W^T) + g * s (x' A^T) B^T,   x' = dropout(x)
 * (without dropout x' W^T is the base output less its bias, so no second base GEMM). The magnitude
 * starts as n (PEFT's initialisation), so that a new DoRA adapter computes what LoRA would.
 * Backward, with z = x' W^T + s (x' A^T) B^T recomputed (nothing more is kept than LoRA keeps):
 *     dm += sum_t dout * z / n;   LoRA's backward on g * dout;   dx' += ((g - 1) * dout) W.
 * The norms come from W A^T, A A^T and B (A A^T):
 *     n_j^2 = ||W_j||^2 + sum_k B_jk (2 s (W A^T)_jk + s^2 (B A A^T)_jk),
 * recomputed when the weights change. QDoRA (use_dora over [peft] quantization = nf4, as PEFT runs
 * DoRA over bitsandbytes' Linear4bit): W is the NF4 base's dequantized weight; W A^T comes from the
 * backend's NF4 product (tile by tile, never a whole weight) and ||W_j|| is computed once from the
 * NF4 store a row at a time (the base is frozen), so nothing dequantizes a whole weight. Everything runs on
 * the backend (its dora_norm, dora_combine and dora_backward ops: kernels/cpu/dora.c, kernels/cuda/dora.cu):
 * the norms and scalings live in its memory, and on a device nothing goes through the host. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model_internal.h"

static long *mag_off(const ctrl_model *m, int l, int t) { return &m->lora_mag[l * LORA_N_TARGETS + t]; }
static long *at_off(const ctrl_model *m, int l, int t) { return &m->dora_at[l * LORA_N_TARGETS + t]; }
static long a_of(const ctrl_model *m, int l, int t) { return m->lora_a[l * LORA_N_TARGETS + t]; }
static long b_of(const ctrl_model *m, int l, int t) { return m->lora_b[l * LORA_N_TARGETS + t]; }

void dora_layout(ctrl_model *m, size_t *cursor, int l, int module, int OUT) {
    char n[160];
    snprintf(n, sizeof n, "model.layers.%d.%s.lora_magnitude_vector", l, ctrl_lora_module_names[module]);
    const int at = m->n_views;
    const long mo = model_add_view(m, cursor, n, 1, OUT, 0, 0); /* decayed, as transformers does */
    if (at < m->cap_views) m->views[at].lora = 1;
    for (int t = 0; t < LORA_N_TARGETS; t++) { /* a fused module's linears: their rows of it */
        int row0, mod_out;
        if (lora_module(m, t, &row0, &mod_out) != module) continue;
        *mag_off(m, l, t) = mo + row0;
        *at_off(m, l, t) = (long)m->dora_norm_n + row0;
    }
    m->dora_norm_n += (size_t)OUT;
}

/* The norms ||W + s B A|| of layer l's target t into m->dora_norm (see the file's comment), and with
 * mag (its magnitude, backend) g = mag / norm into m->dora_g. Over an NF4 base (QDoRA) W A^T is the
 * backend's NF4 product (A W^T, tile by tile, turned by a GEMM with the identity) and ||W_j|| the
 * norms held in m->dora_wn (given to dora_norm as a one-column W). */
static ctrl_status weight_norms(ctrl_model *m, int l, int t, int IN, int OUT, const float *mag) {
    const ctrl_backend_ops *be = m->be;
    const int r = lora_r(m, l, t);
    const double s = lora_s(m, l, t);
    long w, bias;
    lora_base_weight(m, l, t, &w, &bias);
    const float *P = m->dparams, *A = P + a_of(m, l, t), *B = P + b_of(m, l, t);
    const int nf4 = nf4_holds(m, P + w);
    const size_t n_pq = (size_t)OUT * r;
    MODEL_TRY(model_grow(m, (void **)&m->dora_ws, &m->dora_ws_bytes,
                         sizeof(float) * (2 * n_pq + 2 * (size_t)r * r)));
    float *WA = m->dora_ws, *BG = WA + n_pq, *G = BG + n_pq, *I = G + (size_t)r * r;
    if (nf4) { /* A W^T [r, OUT] staged in BG's place, WA = (A W^T)^T I */
        float *one = calloc((size_t)r * r, sizeof(float));
        if (!one) return ctrl_error_set(CTRL_ERR_NOMEM, "QDoRA: an identity of %d", r);
        for (int k = 0; k < r; k++) one[(size_t)k * r + k] = 1.0f;
        const ctrl_status st = be->to_device(I, one, sizeof(float) * (size_t)r * r);
        free(one);
        MODEL_TRY(st);
        MODEL_TRY(nf4_product(m, l, t, BG, A, r));
        MODEL_TRY(be->gemm(1, 0, OUT, r, r, 1.0f, BG, OUT, I, r, 0.0f, WA, r, CTRL_F32, CTRL_F32));
    } else
        MODEL_TRY(be->linear_forward(WA, P + w, A, NULL, OUT, IN, r)); /* W A^T [OUT, r] */
    MODEL_TRY(be->linear_forward(G, A, A, NULL, r, IN, r));            /* A A^T [r, r] */
    MODEL_TRY(be->linear_forward(BG, B, G, NULL, OUT, r, r));          /* B (A A^T) [OUT, r] */
    /* the norms (m->dora_norm, backend), and with mag the scalings magnitude / norm */
    const long at = *at_off(m, l, t);
    return be->dora_norm(m->dora_norm + at, mag ? m->dora_g + at : NULL, nf4 ? m->dora_wn + at : P + w, B, WA,
                         BG, mag, (float)s, OUT, nf4 ? 1 : IN, r);
}

/* QDoRA: ||W_j|| of every adapted row of an NF4 base into m->dora_wn (backend memory), once: the base
 * is frozen (nf4_store drops them when a weight loads again; the model's move to another backend
 * too). A row at a time from the host's store -- whole until ZeRO-3 slices it, which computes them
 * first (ctrl_model_nf4_hold_norms). */
static ctrl_status nf4_norms(ctrl_model *m) {
    if (m->dora_wn || !m->nf4_w) return CTRL_OK;
    const size_t total = m->dora_norm_n ? m->dora_norm_n : 1;
    if (m->dora_wn_host) { /* computed as each weight loaded (a ZeRO-3 rank's pieces of the store) */
        MODEL_TRY(m->be->alloc((void **)&m->dora_wn, sizeof(float) * total));
        return m->be->to_device(m->dora_wn, m->dora_wn_host, sizeof(float) * total);
    }
    float *host = calloc(total, sizeof(float));
    if (!host) return ctrl_error_set(CTRL_ERR_NOMEM, "QDoRA: %zu weight norms", total);
    ctrl_status st = CTRL_OK;
    for (int l = 0; l < m->cfg.n_layers && st == CTRL_OK; l++)
        for (int t = 0; t < LORA_N_TARGETS && st == CTRL_OK; t++) {
            long w, bias;
            if (*mag_off(m, l, t) < 0) continue;
            lora_base_weight(m, l, t, &w, &bias);
            if (nf4_holds(m, m->dparams + w)) st = nf4_row_norms(m, l, t, host + *at_off(m, l, t));
        }
    if (st == CTRL_OK) st = m->be->alloc((void **)&m->dora_wn, sizeof(float) * total);
    if (st == CTRL_OK) st = m->be->to_device(m->dora_wn, host, sizeof(float) * total);
    free(host);
    return st;
}

/* The norms' and scalings' backend memory (released with the backend's scratch). */
static ctrl_status norms_alloc(ctrl_model *m) {
    const size_t total = m->dora_norm_n ? m->dora_norm_n : 1;
    if (m->dora_norm) return CTRL_OK;
    MODEL_TRY(m->be->alloc((void **)&m->dora_norm, sizeof(float) * total));
    return m->be->alloc((void **)&m->dora_g, sizeof(float) * total);
}

/* Layer l's norms, and with `set` its magnitude := norm (else g := magnitude / norm). */
static ctrl_status layer_norms(ctrl_model *m, int l, int set) {
    if (m->nf4_w) MODEL_TRY(nf4_use_layer(m, l)); /* QDoRA: the products below are layer l's */
    for (int t = 0; t < LORA_N_TARGETS; t++) {
        const long mo = *mag_off(m, l, t), at = *at_off(m, l, t);
        if (mo < 0) continue;
        int IN, OUT; /* linear t's (a fused module's row block of it) */
        lora_dims(m, t, &IN, &OUT);
        const float *mag = set ? NULL : m->dparams + mo;
        if (!m->dora_hold_norms || set)
            MODEL_TRY(weight_norms(m, l, t, IN, OUT, mag));
        else /* the norms as they are: the scalings only */
            MODEL_TRY(m->be->dora_norm(m->dora_norm + at, m->dora_g + at, NULL, NULL, NULL, NULL, mag, 0.0f,
                                       OUT, IN, lora_r(m, l, t)));
        if (set) /* host memory: dora_init_magnitudes runs before the model moves */
            memcpy(m->params + mo, m->dora_norm + at, sizeof(float) * (size_t)OUT);
    }
    return CTRL_OK;
}

/* Every adapted layer's norms (see layer_norms). */
static ctrl_status all_norms(ctrl_model *m, int set) {
    MODEL_TRY(norms_alloc(m));
    MODEL_TRY(nf4_norms(m));
    for (int l = 0; l < m->cfg.n_layers; l++) MODEL_TRY(layer_norms(m, l, set));
    return CTRL_OK;
}

ctrl_status dora_nf4_magnitudes_at_load(ctrl_model *m, int l, int t) {
    int IN, OUT;
    lora_dims(m, t, &IN, &OUT);
    MODEL_TRY(norms_alloc(m));
    MODEL_TRY(nf4_norms(m)); /* (from dora_wn_host: this weight's rows' norms held just before) */
    MODEL_TRY(weight_norms(m, l, t, IN, OUT, NULL));
    memcpy(m->params + *mag_off(m, l, t), m->dora_norm + *at_off(m, l, t), sizeof(float) * (size_t)OUT);
    return CTRL_OK;
}

ctrl_status dora_init_magnitudes(ctrl_model *m) {
    if (!m->has_lora || !m->lora->use_dora) return CTRL_OK;
    if (!m->be->host_memory)
        return ctrl_error_set(CTRL_ERR_RUNTIME, "DoRA: magnitudes are initialised before the model moves");
    if (m->nf4_part) { /* QDoRA over a ZeRO-3 rank's pieces of the store: set as each weight loaded whole */
        if (!m->dora_wn_host)
            return ctrl_error_set(
                CTRL_ERR_UNSUPPORTED,
                "QDoRA: the magnitudes over a ZeRO-3 rank's pieces of the NF4 base need the "
                "norms held as it loaded");
        if (m->lora->init == CTRL_LORA_INIT_NONE) { /* B != 0: dora_nf4_magnitudes_at_load set them */
            ctrl_model_weights_changed(m);
            return CTRL_OK;
        }
        /* with B = 0, ||W + s B A|| = ||W|| */
        for (int l = 0; l < m->cfg.n_layers; l++)
            for (int t = 0; t < LORA_N_TARGETS; t++) {
                int IN, OUT;
                if (*mag_off(m, l, t) < 0) continue;
                lora_dims(m, t, &IN, &OUT);
                memcpy(m->params + *mag_off(m, l, t), m->dora_wn_host + *at_off(m, l, t),
                       sizeof(float) * (size_t)OUT);
            }
        ctrl_model_weights_changed(m);
        return CTRL_OK;
    }
    MODEL_TRY(all_norms(m, 1));
    ctrl_model_weights_changed(m);
    return CTRL_OK;
}

ctrl_status dora_prepare(ctrl_model *m) {
    if (!m->has_lora || !m->lora->use_dora || m->dora_valid || m->lora_off) return CTRL_OK;
    if (!ctrl_backend_has(m->be, dora_norm) || !ctrl_backend_has(m->be, dora_backward) ||
        (m->nf4_w && !ctrl_backend_has(m->be, gemm)))
        return ctrl_error_set(CTRL_ERR_UNSUPPORTED,
                              "[peft] use_dora: the %s backend has no DoRA ops (a library built before them)",
                              m->be->name);
    if (m->n_round_skip > 0 || m->dparams_sliced) { /* ZeRO-3: each layer's once it is gathered */
        const size_t n = (size_t)(m->cfg.n_layers > 0 ? m->cfg.n_layers : 1);
        if (!m->dora_pending && !(m->dora_pending = malloc(n)))
            return ctrl_error_set(CTRL_ERR_NOMEM, "DoRA: %zu layer flags", n);
        MODEL_TRY(norms_alloc(m));
        MODEL_TRY(nf4_norms(m)); /* QDoRA: computed before the slicing (ctrl_model_nf4_hold_norms) */
        memset(m->dora_pending, 1, n);
    } else {
        MODEL_TRY(all_norms(m, 0));
        if (m->dora_pending) memset(m->dora_pending, 0, (size_t)(m->cfg.n_layers > 0 ? m->cfg.n_layers : 1));
    }
    m->dora_valid = 1;
    return CTRL_OK;
}

ctrl_status ctrl_model_nf4_hold_norms(ctrl_model *m) {
    return m->has_lora && m->lora->use_dora ? nf4_norms(m) : CTRL_OK;
}

ctrl_status dora_layer_ready(ctrl_model *m, int l) {
    if (!m->dora_pending || !m->dora_valid || l < 0 || l >= m->cfg.n_layers || !m->dora_pending[l])
        return CTRL_OK;
    MODEL_TRY(layer_norms(m, l, 0));
    m->dora_pending[l] = 0;
    return CTRL_OK;
}

ctrl_status dora_combine(ctrl_model *m, int l, int t, float *out, const float *yl, const float *yb, int OUT) {
    long w, bias;
    lora_base_weight(m, l, t, &w, &bias);
    return m->be->dora_combine(out, yl, yb, bias >= 0 ? m->dparams + bias : NULL,
                               m->dora_g + *at_off(m, l, t), m->T, OUT);
}

ctrl_status dora_backward(ctrl_model *m, int l, int t, const layer_acts *a, float *dx, const float *dout,
                          const float *x, int IN, int OUT) {
    const ctrl_backend_ops *be = m->be;
    const int T = m->T, r = lora_r(m, l, t);
    const float *P = m->dparams;
    const long ao = a_of(m, l, t), bo = b_of(m, l, t), mo = *mag_off(m, l, t);
    long w, bias;
    lora_base_weight(m, l, t, &w, &bias);
    float *dxa, *w1, *w2, *w3;
    MODEL_TRY(lora_scratch(m, &dxa, &w1, &w2, &w3));
    const float *xa = a->lora_xa[t], *xp = x;
    const int drop = lora_dropout_on(m);
    if (drop) {
        MODEL_TRY(lora_apply_dropout(m, l, t, w1, x, (int64_t)T * IN));
        xp = w1;
    }
    MODEL_TRY(model_linear_forward(m, w2, xa, P + bo, NULL, T, r, OUT)); /* s (x' A^T) B^T */
    MODEL_TRY(model_linear_forward(m, w3, xp, P + w, NULL, T, IN, OUT)); /* x' W^T */
    /* dm, and dout scaled by g (into w2) and by g - 1 (into w3) */
    MODEL_TRY(be->dora_backward(model_grad(m, mo), w2, w3, dout, m->dora_norm + *at_off(m, l, t),
                                m->dora_g + *at_off(m, l, t), T, OUT));
    MODEL_TRY(model_linear_backward(m, dxa, model_grad(m, bo), NULL, w2, xa, P + bo, T, r, OUT));
    MODEL_TRY(be->scale(dxa, lora_s(m, l, t), (int64_t)T * r));
    MODEL_TRY(model_linear_backward(m, w2, model_grad(m, ao), NULL, dxa, xp, P + ao, T, IN, r)); /* dxa A */
    MODEL_TRY(model_linear_backward(m, w1, NULL, NULL, w3, x, P + w, T, IN, OUT)); /* ((g-1) dout) W */
    MODEL_TRY(be->residual_forward(w2, w2, w1, (int64_t)T * IN));
    if (drop) { /* through the mask: the same draw with the input's place taken by dx' */
        MODEL_TRY(lora_apply_dropout(m, l, t, w1, w2, (int64_t)T * IN));
        return be->residual_forward(dx, dx, w1, (int64_t)T * IN);
    }
    return be->residual_forward(dx, dx, w2, (int64_t)T * IN);
}
