/* QLoRA in the model ([peft] quantization = nf4; lora->nf4): the base's projection weights (q, k,
 * v, o, gate, up, down of every layer) are quantized to NF4 as they load (nf4.c: bitsandbytes'
 * code book, blocks of 64, double-quantized absmax) and never kept in fp32: every layer's views of
 * them share the fp32 slot of layer 0's, into which a layer's seven weights are dequantized before
 * its forward or backward (a layer at a time, as bitsandbytes' Linear4bit dequantizes per
 * projection; with bf16 compute the slot's rounded copy follows, as bnb_4bit_compute_dtype =
 * bfloat16 multiplies the dequantized weight in bf16). The slot is frozen (no gradient), the
 * adapters train as with LoRA. Memory: 4.5 bits
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

ctrl_status nf4_layer_weights(ctrl_model *m, int l) {
    if (m->nf4_layer == l) return CTRL_OK;
    const layer_offsets *o = &m->layers[l];
    const long w[LORA_N_TARGETS] = {o->wq, o->wk, o->wv, o->wo, o->wg, o->wu, o->wd};
    for (int t = 0; t < LORA_N_TARGETS; t++) {
        const ctrl_nf4 *q = &m->nf4_w[l * LORA_N_TARGETS + t];
        if (!q->packed)
            return ctrl_error_set(CTRL_ERR_RUNTIME, "QLoRA: layer %d's weight %d was never loaded", l, t);
        float *absmax = malloc(sizeof(float) * (size_t)((q->n + CTRL_NF4_BLOCK - 1) / CTRL_NF4_BLOCK));
        if (!absmax) return ctrl_error_set(CTRL_ERR_NOMEM, "QLoRA: absmax of %lld weights", (long long)q->n);
        ctrl_nf4_absmax(q, absmax);
        ctrl_nf4_dequantize(q, absmax, m->params + w[t]);
        free(absmax);
        if (m->linear_bf16 && m->rounded_valid) /* bf16 compute multiplies the slot's rounded copy */
            MODEL_TRY(m->be->round_to_bf16(m->rounded + w[t], m->params + w[t], q->n));
    }
    m->nf4_layer = l;
    return CTRL_OK;
}

void nf4_free(ctrl_model *m) {
    for (int i = 0; m->nf4_w && i < m->cfg.n_layers * LORA_N_TARGETS; i++) ctrl_nf4_free(&m->nf4_w[i]);
    free(m->nf4_w);
    m->nf4_w = NULL;
}
