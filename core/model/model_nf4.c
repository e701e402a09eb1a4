/* QLoRA in the model ([peft] quantization = nf4; lora->nf4): the base's projection weights (q, k,
 * v, o, gate, up, down of every layer) are quantized to NF4 as they load (nf4.c: bitsandbytes'
 * code book, blocks of 64, double-quantized absmax) and never kept in fp32. Every layer's views of
 * them share the fp32 slot of layer 0's, which only stages a weight while it loads; after loading its
 * pages are given back (nf4_release_slot). A layer's forward and backward name the layer
 * (nf4_use_layer), and each product with one of its weights is the backend's NF4 product
 * (nf4_linear_forward / nf4_linear_backward: kernels/cpu/gemm_nf4.c, kernels/cuda/nf4.cu), which
 * dequantizes W a tile at a time inside the GEMM, never the whole weight (with bf16 compute the
 * tile's values rounded to bf16, as bnb_4bit_compute_dtype = bfloat16 multiplies the dequantized
 * weight in bf16). The base is frozen (no gradient), the adapters train as with LoRA. On a device
 * backend the NF4 store is copied into its memory and the device's kernels read it there.
 * nf4_layer_weights still dequantizes a whole layer into the slot, for tests that compare with a
 * full-precision model. Memory: 4.5 bits per quantized weight (+ 1 byte of absmax per 64, a float per
 * 16,384) instead of 32.
 *
 * What transformers 5 + bitsandbytes quantize (replace_with_bnb_linear: every nn.Linear but the head)
 * is what is held in NF4 here: a fused module of Phi-3 (qkv_proj, gate_up_proj) is one nn.Linear, so
 * one NF4 tensor whose blocks of 64 run over its whole flat index (a row block may start inside a
 * block; the products then read from `first` into it: cpu_ops.h's ctrl_nf4_ref); a mixture-of-experts
 * layer's experts are 3-D parameters and its router no nn.Linear, so bitsandbytes leaves them in the
 * load dtype, and so do we (fp32 parameters, with their adapters, lora_moe.c); a dense layer of an MoE
 * model (mlp_only_layers) has its gate/up/down in NF4. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model_internal.h"

/* The NF4 tensor projection t's values are in, and where in it they start: a fused module's linears
 * are row blocks of its first one's tensor (q, k, v of qkv_proj at LORA_Q; gate, up of gate_up_proj
 * at LORA_GATE); every other projection is its own. */
static int owner_of(const ctrl_model *m, int t, int64_t *first) {
    int row0, out;
    const int mod = lora_module(m, t, &row0, &out);
    *first = (int64_t)row0 * m->cfg.hidden_size; /* fused modules read the hidden states */
    return mod == LORA_QKV ? LORA_Q : mod == LORA_GATE_UP ? LORA_GATE : t;
}

/* Whether layer l's projection t is an NF4 tensor of its own (not a row block of a fused one, and not
 * the missing MLP of a mixture-of-experts layer). */
static int stored(const ctrl_model *m, int l, int t) {
    int64_t first;
    return owner_of(m, t, &first) == t && (t < LORA_GATE || m->layers[l].router < 0);
}

/* Whether store entry i is held where the products read it (a device model: the device's buffers). */
static int held(const ctrl_model *m, int i) {
    return m->nf4_dev ? m->nf4_dev[3 * i] != NULL : m->nf4_w[i].packed != NULL;
}

/* Gives the pages wholly inside each projection's shared slot (the first layer's views, which every
 * layer's share) back to the system once every weight is stored: the slot only stages a weight as it
 * loads, and the products read the NF4 store (reading the slot afterwards reads zeros). Only the
 * weights' own pages: the layer's norms and biases lie between them. */
static void release_slot(ctrl_model *m) {
    for (int l = 0; l < m->cfg.n_layers; l++)
        for (int t = 0; t < LORA_N_TARGETS; t++)
            if (stored(m, l, t) && !m->nf4_w[l * LORA_N_TARGETS + t].packed) return;
    for (int i = 0; i < m->n_views; i++) {
        const ctrl_param_view *v = &m->views[i];
        if (v->nf4 < 1 || (long)v->offset != m->nf4_slot[(v->nf4 - 1) % LORA_N_TARGETS]) continue;
        model_release_range(m, (long)v->offset, (long)(v->offset + (size_t)v->numel));
    }
}

ctrl_status nf4_store(ctrl_model *m, const ctrl_param_view *v) {
    const int n = m->cfg.n_layers * LORA_N_TARGETS;
    if (!m->nf4_w) {
        m->nf4_w = calloc((size_t)n, sizeof *m->nf4_w);
        if (!m->nf4_w) return ctrl_error_set(CTRL_ERR_NOMEM, "QLoRA: %d NF4 weights", n);
        m->nf4_layer = -1;
    }
    ctrl_nf4 *q = &m->nf4_w[v->nf4 - 1];
    ctrl_nf4_free(q);
    m->nf4_layer = -1; /* the slot now holds this weight as loaded, not dequantized */
    MODEL_TRY(ctrl_nf4_quantize(m->params + v->offset, v->numel, q));
    if (m->dora_wn) m->be->free(m->dora_wn), m->dora_wn = NULL; /* QDoRA's row norms: of the old weight */
    release_slot(m);
    return CTRL_OK;
}

ctrl_status nf4_store_part(ctrl_model *m, const ctrl_param_view *v, int64_t v0, int64_t v1) {
    const int64_t n = v->numel;
    if (v0 < 0 || v1 < v0 || v1 > n || (v0 % CTRL_NF4_SUPER && v0 != n) || (v1 % CTRL_NF4_SUPER && v1 != n))
        return ctrl_error_set(CTRL_ERR_RUNTIME,
                              "QLoRA: %s: a piece [%lld, %lld) of %lld values off the super-blocks", v->name,
                              (long long)v0, (long long)v1, (long long)n);
    const size_t nw = (size_t)m->cfg.n_layers * LORA_N_TARGETS;
    if (!m->nf4_part && !(m->nf4_part = calloc(2 * nw, sizeof *m->nf4_part)))
        return ctrl_error_set(CTRL_ERR_NOMEM, "QLoRA: the NF4 pieces");
    MODEL_TRY(nf4_store(m, v));           /* the whole weight (the offset is its blocks' mean), then cut */
    MODEL_TRY(nf4_hold_dora_norms(m, v)); /* QDoRA: its rows' norms, while it is whole */
    ctrl_nf4 *q = &m->nf4_w[v->nf4 - 1];
    size_t c[3];
    ctrl_nf4_part_counts(v0, v1, c);
    uint8_t *part[3] = {malloc(c[0] + 1), malloc(c[1] + 1), malloc(c[2] + sizeof(float))};
    const uint8_t *src[3] = {q->packed + v0 / 2, q->qabsmax + v0 / CTRL_NF4_BLOCK,
                             (const uint8_t *)(q->absmax2 + v0 / CTRL_NF4_SUPER)};
    if (!part[0] || !part[1] || !part[2]) {
        free(part[0]), free(part[1]), free(part[2]);
        return ctrl_error_set(CTRL_ERR_NOMEM, "QLoRA: %s's piece of %lld values", v->name,
                              (long long)(v1 - v0));
    }
    for (int k = 0; k < 3; k++) memcpy(part[k], src[k], c[k]);
    free(q->packed), free(q->qabsmax), free(q->absmax2);
    q->packed = part[0], q->qabsmax = part[1], q->absmax2 = (float *)part[2]; /* n, offset: the whole's */
    m->nf4_part[2 * (v->nf4 - 1)] = v0, m->nf4_part[2 * (v->nf4 - 1) + 1] = v1;
    return CTRL_OK;
}

const int64_t *ctrl_model_nf4_parts(const ctrl_model *m) { return m->nf4_part; }

void ctrl_model_nf4_parts_done(ctrl_model *m) {
    free(m->nf4_part);
    m->nf4_part = NULL;
}

/* Bytes of each of a weight's three device buffers (packed, absmax bytes, absmax scales). */
static size_t part_bytes(const ctrl_nf4 *q, int k) {
    const int64_t nb = (q->n + CTRL_NF4_BLOCK - 1) / CTRL_NF4_BLOCK;
    return k == 0   ? (size_t)(q->n + 1) / 2
           : k == 1 ? (size_t)nb
                    : sizeof(float) * (size_t)((nb + CTRL_NF4_BLOCK2 - 1) / CTRL_NF4_BLOCK2);
}

ctrl_status nf4_to_device(ctrl_model *m) {
    if (!m->nf4_w || m->be->host_memory) return CTRL_OK;
    /* (a ZeRO-3 rank's pieces: copied to the device by zero_nf4.c's cut, which defers the move) */
    if (m->nf4_part && !m->dev_deferred)
        return ctrl_error_set(CTRL_ERR_UNSUPPORTED, "QLoRA: the NF4 store holds a ZeRO-3 rank's pieces only");
    const int n = m->cfg.n_layers * LORA_N_TARGETS;
    const ctrl_backend_ops *be = m->be;
    if (!(m->nf4_dev = calloc((size_t)n * 3, sizeof *m->nf4_dev)))
        return ctrl_error_set(CTRL_ERR_NOMEM, "QLoRA: %d device weights", n);
    ctrl_status st = be->alloc((void **)&m->nf4_codes, sizeof(float) * (16 + 256));
    if (st == CTRL_OK) st = be->to_device(m->nf4_codes, ctrl_nf4_code, sizeof(float) * 16);
    if (st == CTRL_OK) st = be->to_device(m->nf4_codes + 16, ctrl_nf4_dynamic_code, sizeof(float) * 256);
    for (int i = 0; i < n && st == CTRL_OK && !m->dev_deferred; i++) {
        const ctrl_nf4 *q = &m->nf4_w[i];
        const void *src[3] = {q->packed, q->qabsmax, q->absmax2};
        for (int k = 0; k < 3 && st == CTRL_OK && q->packed; k++) {
            st = be->alloc(&m->nf4_dev[3 * i + k], part_bytes(q, k));
            if (st == CTRL_OK) st = be->to_device(m->nf4_dev[3 * i + k], src[k], part_bytes(q, k));
        }
    }
    m->nf4_layer = -1; /* the device's slot holds no layer yet */
    if (st != CTRL_OK) nf4_release_device(m);
    return st;
}

void nf4_release_device(ctrl_model *m) {
    for (int i = 0; m->nf4_dev && i < m->cfg.n_layers * LORA_N_TARGETS * 3; i++)
        if (m->nf4_dev[i]) m->be->free(m->nf4_dev[i]);
    free(m->nf4_dev);
    if (m->nf4_codes) m->be->free(m->nf4_codes);
    m->nf4_dev = NULL, m->nf4_codes = NULL;
    m->nf4_layer = -1;
}

ctrl_status nf4_layer_weights(ctrl_model *m, int l) {
    const layer_offsets *o = &m->layers[l];
    const long w[LORA_N_TARGETS] = {o->wq, o->wk, o->wv, o->wo, o->wg, o->wu, o->wd};
    for (int t = 0; t < LORA_N_TARGETS; t++) { /* a fused tensor whole, into its first linear's slot */
        if (!stored(m, l, t)) continue;
        const ctrl_nf4 *q = &m->nf4_w[l * LORA_N_TARGETS + t];
        if (!held(m, l * LORA_N_TARGETS + t) || m->nf4_part)
            return ctrl_error_set(CTRL_ERR_RUNTIME,
                                  "QLoRA: layer %d's weight %d was never loaded (or is a "
                                  "ZeRO-3 rank's piece)",
                                  l, t);
        if (m->nf4_dev) { /* on the device: the kernel dequantizes into the device's slot */
            void *const *d = &m->nf4_dev[3 * (l * LORA_N_TARGETS + t)];
            MODEL_TRY(m->be->nf4_dequantize(m->dparams + w[t], d[0], d[1], d[2], q->offset, m->nf4_codes,
                                            m->nf4_codes + 16, q->n));
            if (m->linear_bf16 && m->rounded_valid)
                MODEL_TRY(m->be->round_to_bf16(m->rounded + w[t], m->dparams + w[t], q->n));
            continue;
        }
        float *absmax = malloc(sizeof(float) * (size_t)((q->n + CTRL_NF4_BLOCK - 1) / CTRL_NF4_BLOCK));
        if (!absmax) return ctrl_error_set(CTRL_ERR_NOMEM, "QLoRA: absmax of %lld weights", (long long)q->n);
        ctrl_nf4_absmax(q, absmax);
        ctrl_nf4_dequantize(q, absmax, m->params + w[t]);
        free(absmax);
        if (m->linear_bf16 && m->rounded_valid) /* bf16 compute multiplies the slot's rounded copy */
            MODEL_TRY(m->be->round_to_bf16(m->rounded + w[t], m->dparams + w[t], q->n));
    }
    m->nf4_layer = l;
    return CTRL_OK;
}

ctrl_status nf4_dequantize_view(const ctrl_model *m, const ctrl_param_view *v, float *out) {
    const ctrl_nf4 *q = &m->nf4_w[v->nf4 - 1];
    if (!q->packed || q->n != v->numel || m->nf4_part) /* (a device model keeps the host's store it copied) */
        return ctrl_error_set(CTRL_ERR_UNSUPPORTED, "QLoRA: %s is not held whole (a ZeRO-3 slice)", v->name);
    float *absmax = malloc(sizeof(float) * (size_t)((q->n + CTRL_NF4_BLOCK - 1) / CTRL_NF4_BLOCK));
    if (!absmax) return ctrl_error_set(CTRL_ERR_NOMEM, "QLoRA: absmax of %lld weights", (long long)q->n);
    ctrl_nf4_absmax(q, absmax);
    ctrl_nf4_dequantize(q, absmax, out);
    free(absmax);
    return CTRL_OK;
}

struct ctrl_nf4 *ctrl_model_nf4_store(ctrl_model *m, int *per_layer) {
    *per_layer = LORA_N_TARGETS;
    return m->nf4_w;
}

void **ctrl_model_nf4_device(ctrl_model *m) { return m->nf4_dev; }

void nf4_free(ctrl_model *m) {
    for (int i = 0; m->nf4_w && i < m->cfg.n_layers * LORA_N_TARGETS; i++) ctrl_nf4_free(&m->nf4_w[i]);
    free(m->nf4_w);
    m->nf4_w = NULL;
    ctrl_model_nf4_parts_done(m);
}

ctrl_status nf4_use_layer(ctrl_model *m, int l) {
    for (int t = 0; t < LORA_N_TARGETS; t++)
        if (stored(m, l, t) && (!held(m, l * LORA_N_TARGETS + t) || m->nf4_part))
            return ctrl_error_set(CTRL_ERR_RUNTIME,
                                  "QLoRA: layer %d's weight %d is not held (never loaded, or a ZeRO-3 slice "
                                  "used without its gather)",
                                  l, t);
    m->nf4_layer = l;
    return CTRL_OK;
}

/* Which of the seven projections w (a pointer into dparams) is: every layer's views are the slots
 * (a fused module's linears: their row blocks of its slot); -1: none. */
static int target_of(const ctrl_model *m, const float *w) {
    const long at = (long)(w - m->dparams);
    for (int t = 0; t < LORA_N_TARGETS; t++) {
        int64_t first;
        const long slot = m->nf4_slot[owner_of(m, t, &first)];
        if (slot >= 0 && slot + (long)first == at) return t;
    }
    return -1;
}

int nf4_holds(const ctrl_model *m, const float *w) {
    return m->nf4_w && w >= m->dparams && w < m->dparams + m->n_params && target_of(m, w) >= 0;
}

/* The backend's view of layer l's projection t (host: the host's store, wherever the model is). */
static ctrl_status ref_at(const ctrl_model *m, int l, int t, int host, ctrl_nf4_ref *r) {
    int64_t first;
    const int i = l * LORA_N_TARGETS + owner_of(m, t, &first);
    const ctrl_nf4 *q = &m->nf4_w[i];
    int in, out;
    lora_dims(m, t, &in, &out); /* projection t's own [out, in] (a row block of a fused tensor) */
    const int dev = m->nf4_dev && !host;
    if (!(dev ? held(m, i) : q->packed != NULL) || first + (int64_t)in * out > q->n)
        return ctrl_error_set(CTRL_ERR_RUNTIME, "QLoRA: layer %d's weight %d is not held in NF4%s", l, t,
                              dev || !m->nf4_dev ? "" : " in host memory (a ZeRO-3 slice on the device)");
    if (dev)
        *r = (ctrl_nf4_ref){m->nf4_dev[3 * i], m->nf4_dev[3 * i + 1], m->nf4_dev[3 * i + 2], q->offset,
                            m->nf4_codes,      m->nf4_codes + 16,     (int64_t)in * out,     first};
    else
        *r = (ctrl_nf4_ref){q->packed,         q->qabsmax,    q->absmax2,
                            q->offset,         ctrl_nf4_code, ctrl_nf4_dynamic_code,
                            (int64_t)in * out, first};
    return CTRL_OK;
}

/* The backend's view of the weight w of the layer in use. */
static ctrl_status ref_of(const ctrl_model *m, const float *w, ctrl_nf4_ref *r) {
    const int t = target_of(m, w), l = m->nf4_layer;
    if (t < 0 || l < 0)
        return ctrl_error_set(CTRL_ERR_RUNTIME, "QLoRA: a product with no layer's NF4 weight");
    return ref_at(m, l, t, 0, r);
}

ctrl_status nf4_product(const ctrl_model *m, int l, int t, float *out, const float *x, int T) {
    ctrl_nf4_ref r;
    MODEL_TRY(ref_at(m, l, t, 0, &r));
    int in, out_n;
    lora_dims(m, t, &in, &out_n);
    return m->be->nf4_linear_forward(out, x, &r, NULL, T, in, out_n, 0);
}

ctrl_status nf4_row_norms(const ctrl_model *m, int l, int t, float *norms) {
    ctrl_nf4_ref r;
    MODEL_TRY(ref_at(m, l, t, 1, &r));
    int in, out;
    lora_dims(m, t, &in, &out);
    float *row = malloc(sizeof(float) * (size_t)in);
    if (!row) return ctrl_error_set(CTRL_ERR_NOMEM, "QDoRA: a row of %d weights", in);
    for (int j = 0; j < out; j++) { /* a row of W at a time, as the products dequantize it */
        ctrl_cpu_nf4_values(&r, (int64_t)j * in, in, row);
        double n2 = 0;
        for (int i = 0; i < in; i++) n2 += (double)row[i] * row[i];
        norms[j] = (float)sqrt(n2);
    }
    free(row);
    return CTRL_OK;
}

ctrl_status nf4_linear_forward(const ctrl_model *m, float *out, const float *x, const float *w,
                               const float *bias, int T, int IN, int OUT) {
    ctrl_nf4_ref r;
    MODEL_TRY(ref_of(m, w, &r));
    return m->be->nf4_linear_forward(out, x, &r, bias, T, IN, OUT, m->linear_bf16 && !model_bf16_as_fp32(m));
}

ctrl_status nf4_linear_backward(const ctrl_model *m, float *dx, float *dw, float *dbias, const float *dout,
                                const float *w, int T, int IN, int OUT) {
    if (dw || dbias)
        return ctrl_error_set(CTRL_ERR_RUNTIME,
                              "QLoRA: a gradient for a base weight held in NF4 (it is frozen)");
    if (!dx) return CTRL_OK;
    ctrl_nf4_ref r;
    MODEL_TRY(ref_of(m, w, &r));
    return m->be->nf4_linear_backward(dx, dout, &r, T, IN, OUT, m->linear_bf16 && !model_bf16_as_fp32(m));
}

void ctrl_model_nf4_summary(const ctrl_model *m, char *buf, size_t cap) {
    if (cap) buf[0] = 0;
    if (!m->nf4_w || !cap) return;
    const ctrl_model_config *c = &m->cfg;
    long long nf4 = 0, experts = 0;
    for (int i = 0; i < c->n_layers * LORA_N_TARGETS; i++) nf4 += m->nf4_w[i].packed ? m->nf4_w[i].n : 0;
    int moe = 0;
    for (int l = 0; l < c->n_layers; l++)
        if (m->layers[l].router >= 0) /* the router [E, C] and each expert's gate, up and down */
            moe++, experts += (long long)c->n_experts * c->hidden_size * (1 + 3LL * c->moe_intermediate_size);
    char dense[96] = "";
    if (moe && moe < c->n_layers)
        snprintf(dense, sizeof dense, " and the MLP projections (gate/up/down) of %d dense layer%s",
                 c->n_layers - moe, c->n_layers - moe > 1 ? "s" : "");
    if (!moe)
        snprintf(buf, cap,
                 "in NF4 (QLoRA): every layer's attention and MLP projections (q/k/v/o, gate/up/down), %lld "
                 "weights; fp32: the embeddings, norms and LM head (the fp32 count above includes one "
                 "layer's projections: the slot each weight is quantized from as it loads)",
                 nf4);
    else
        snprintf(buf, cap,
                 "in NF4 (QLoRA): every layer's attention projections (q/k/v/o)%s, %lld weights; fp32, as "
                 "bitsandbytes leaves them (not nn.Linear): the experts and routers of %d MoE layer%s (%lld "
                 "parameters), the embeddings, norms and LM head (the fp32 count above includes one layer's "
                 "projections: the slot each weight is quantized from as it loads)",
                 dense, nf4, moe, moe > 1 ? "s" : "", experts);
}

ctrl_status nf4_hold_dora_norms(ctrl_model *m, const ctrl_param_view *v) {
    if (!m->has_lora || !m->lora->use_dora || v->nf4 < 1) return CTRL_OK;
    const int i = v->nf4 - 1, l = i / LORA_N_TARGETS;
    if (!m->dora_wn_host && !(m->dora_wn_host = calloc(m->dora_norm_n ? m->dora_norm_n : 1, sizeof(float))))
        return ctrl_error_set(CTRL_ERR_NOMEM, "QDoRA: %zu weight norms", m->dora_norm_n);
    /* the adapted linears whose base is entry i (a fused one's rows of it) */
    for (int t = 0; t < LORA_N_TARGETS; t++) {
        int64_t first;
        if (m->lora_mag[l * LORA_N_TARGETS + t] < 0 || l * LORA_N_TARGETS + owner_of(m, t, &first) != i)
            continue;
        MODEL_TRY(nf4_row_norms(m, l, t, m->dora_wn_host + m->dora_at[l * LORA_N_TARGETS + t]));
        /* B != 0 (init_lora_weights = false): the magnitudes need W A^T too, while W is whole */
        if (m->lora->init == CTRL_LORA_INIT_NONE) MODEL_TRY(dora_nf4_magnitudes_at_load(m, l, t));
    }
    return CTRL_OK;
}
