/* QLoRA in the model ([peft] quantization = nf4; lora->nf4): the base's projection weights (q, k,
 * v, o, gate, up, down of every layer) are quantized to NF4 as they load (nf4.c: bitsandbytes'
 * code book, blocks of 64, double-quantized absmax) and never kept in fp32: every layer's views of
 * them share the fp32 slot of layer 0's, into which a layer's seven weights are dequantized before
 * its forward or backward (a layer at a time, as bitsandbytes' Linear4bit dequantizes per
 * projection; with bf16 compute the slot's rounded copy follows, as bnb_4bit_compute_dtype =
 * bfloat16 multiplies the dequantized weight in bf16). The slot is frozen (no gradient), the
 * adapters train as with LoRA. On a device backend the NF4 store is copied into its memory and a
 * kernel (the backend's nf4_dequantize) fills the device's slot, the same values bit for bit.
 * Memory: 4.5 bits
 * per quantized weight (+ 1 byte of absmax per 64, a float per 16,384) instead of 32. */
#include <stdlib.h>

#include "model/model_internal.h"

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
    return CTRL_OK;
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
    const int n = m->cfg.n_layers * LORA_N_TARGETS;
    const ctrl_backend_ops *be = m->be;
    if (!(m->nf4_dev = calloc((size_t)n * 3, sizeof *m->nf4_dev)))
        return ctrl_error_set(CTRL_ERR_NOMEM, "QLoRA: %d device weights", n);
    ctrl_status st = be->alloc((void **)&m->nf4_codes, sizeof(float) * (16 + 256));
    if (st == CTRL_OK) st = be->to_device(m->nf4_codes, ctrl_nf4_code, sizeof(float) * 16);
    if (st == CTRL_OK) st = be->to_device(m->nf4_codes + 16, ctrl_nf4_dynamic_code, sizeof(float) * 256);
    for (int i = 0; i < n && st == CTRL_OK; i++) {
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
    if (m->nf4_layer == l) return CTRL_OK;
    const layer_offsets *o = &m->layers[l];
    const long w[LORA_N_TARGETS] = {o->wq, o->wk, o->wv, o->wo, o->wg, o->wu, o->wd};
    for (int t = 0; t < LORA_N_TARGETS; t++) {
        const ctrl_nf4 *q = &m->nf4_w[l * LORA_N_TARGETS + t];
        if (!q->packed)
            return ctrl_error_set(CTRL_ERR_RUNTIME, "QLoRA: layer %d's weight %d was never loaded", l, t);
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

void nf4_free(ctrl_model *m) {
    for (int i = 0; m->nf4_w && i < m->cfg.n_layers * LORA_N_TARGETS; i++) ctrl_nf4_free(&m->nf4_w[i]);
    free(m->nf4_w);
    m->nf4_w = NULL;
}
