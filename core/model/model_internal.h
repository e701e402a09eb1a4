/* The model's internals, shared by model.c (training forward/backward) and model_decode.c
 * (incremental decoding over a KV cache). Not part of any public API. */
#ifndef CTRL_CORE_MODEL_INTERNAL_H
#define CTRL_CORE_MODEL_INTERNAL_H

#include "model/model.h"

/* Offsets (in floats) of one layer's tensors inside the flat buffer; -1 when absent. */
typedef struct layer_offsets {
    long ln1, wq, bq, wk, bk, wv, bv, wo, q_norm, k_norm, ln2, wg, wu, wd;
} layer_offsets;

/* One layer's saved activations. */
typedef struct layer_acts {
    float *x_in, *ln1, *rstd1, *q_raw, *k_raw, *q_rstd, *k_rstd, *q, *k, *v, *att, *lse, *x_mid, *ln2, *rstd2,
        *g, *u, *h;
} layer_acts;

struct ctrl_model {
    ctrl_model_config cfg;
    const ctrl_attention_ops *attn;
    const ctrl_attention_ops *paged; /* decoding's (ctrl_model_set_paged_attention) */
    float temperature; /* the head's: log-probs and entropies of softmax(logits / temperature) */
    int linear_bf16;   /* linear projections in bf16 (ctrl_model_set_compute_dtype) */
    float *rounded;    /* with linear_bf16: the parameters rounded to bf16 values (what the linear
                          projections multiply with), rebuilt after ctrl_model_weights_changed */
    int rounded_valid;
    float *params, *grads;
    size_t n_params;
    ctrl_param_view *views;
    int n_views, cap_views;
    long off_embed, off_norm, off_lm_head;
    layer_offsets *layers;
    /* RoPE tables [rope_len, head_dim/2] */
    float *cos_tab, *sin_tab;
    int rope_len;
    /* activations of the last forward */
    int T, act_cap_T;
    float *act_mem;
    layer_acts *acts;
    float *x_out, *lnf, *rstdf, *head_lse, *head_ent;
    float *head_dh;    /* a fused forward's dL/d(final norm output) [T, C], for the backward */
    int head_dh_ready; /* the last forward was fused */
    /* scratch kept between steps (grown as needed): the head's, dL/d(head input), the backward's */
    void *head_ws;
    float *bwd_mem;
    size_t head_ws_bytes, head_dh_bytes, bwd_bytes;
    ctrl_batch batch;
    int32_t *batch_mem;
    /* memory strategy (may be NULL) and which layers it recomputes */
    const ctrl_memory_ops *mem_ops;
    ctrl_memory *mem;
    uint8_t *recompute;
    int n_recompute;
    size_t act_bytes;
    /* decoding's own scratch (model_decode.c): one set of layer internals for every layer, the
     * layer inputs in two buffers taking turns, and the new tokens' positions; the training
     * activations and batch are left as they were */
    float *dec_mem;
    int dec_cap_T;
    layer_acts *dec_acts;
    float *dec_out;
    int32_t *dec_pos;
};

/* With bf16 compute: the rounded weights brought up to date (before a forward or a decode). */
ctrl_status model_prepare_weights(ctrl_model *m);
/* A linear projection in the model's compute dtype (ctrl_cpu_linear_forward or its bf16 twin,
 * multiplying with the rounded copy of w). */
ctrl_status model_linear_forward(const ctrl_model *m, float *out, const float *x, const float *w,
                                 const float *bias, int T, int IN, int OUT);
ctrl_status model_linear_backward(const ctrl_model *m, float *dx, float *dw, float *dbias, const float *dout,
                                  const float *x, const float *w, int T, int IN, int OUT);
/* Activation buffers for T tokens (model->acts, x_out, ...). */
ctrl_status model_ensure_acts(ctrl_model *m, int T);
/* One decoder layer from acts[l].x_in over m->T tokens at m->batch.positions, writing the layer's
 * output into `next` (NULL: stop after the MLP's activations, all a recompute for backward needs).
 * `attend` computes acts[l].att from acts[l].q, k, v: the attention plugin in training, the paged
 * KV cache in decoding. */
typedef ctrl_status (*model_attention_fn)(ctrl_model *m, int l, layer_acts *a, void *ctx);
ctrl_status model_layer_forward(ctrl_model *m, int l, float *next, model_attention_fn attend, void *ctx);
/* RoPE tables covering positions [0, max_pos). */
ctrl_status model_ensure_rope(ctrl_model *m, int max_pos);

#endif
