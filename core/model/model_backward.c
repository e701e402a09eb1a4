/* The decoder backward (see model.h), through the backend ops table like the forward (model.c).
 * Layer by layer from the top, each layer a memory strategy recomputes runs its forward again
 * first (without the last projection, which backward does not need). */
#include <stddef.h>

#include "model/model_internal.h"

/* The gradient scratch of one layer's backward, on the backend. */
typedef struct layer_grads {
    float *dres;         /* [T, C] dL/d(residual stream) at the layer's output, then at its input */
    float *dtmp;         /* [T, C] dL/d(a norm's output) being summed up */
    float *d1, *d2, *d3; /* [T, max(I, H*D)] each */
    float *dk, *dv;      /* [T, HK*D] */
} layer_grads;

/* How many products read layer l's input x of weight w as the B of a weight gradient: dW = dY^T x
 * when w trains, dA = dXA^T x when the adapter on target t does (model_share). */
static int dw_readers(const ctrl_model *m, int l, long w, int t) {
    return (model_grad(m, w) != NULL) + lora_reads(m, l, t, 1);
}

/* MLP then attention of layer l, from dres = dL/d(layer output) to dres = dL/d(layer input). */
static ctrl_status layer_backward(ctrl_model *m, int l, const layer_grads *g) {
    const ctrl_backend_ops *be = m->be;
    const ctrl_model_config *c = &m->cfg;
    const int T = m->T, C = c->hidden_size, I = c->intermediate_size, H = c->n_heads, HK = c->n_kv_heads,
              D = c->head_dim;
    const float *P = m->dparams;
    float *dres = g->dres, *dtmp = g->dtmp, *d1 = g->d1, *d2 = g->d2, *d3 = g->d3, *dk = g->dk, *dv = g->dv;
    const int32_t *positions = m->dev_batch.positions;
    const layer_offsets *o = &m->layers[l];
    layer_acts *a = &m->acts[l];
    if (m->nf4_w) MODEL_TRY(nf4_use_layer(m, l));          /* QLoRA: this layer's NF4 weights */
    if (m->w16) MODEL_TRY(model_bf16_layer_weights(m, l)); /* held in bf16: widened again for dX */
    const int sandwich = c->sandwich_norm;
    /* MLP: dres is the gradient of the layer output = x_mid + down(swiglu(gate, up)) (Gemma 2: of
     * x_mid + post_ffw_norm(down(geglu(gate, up))), whose norm's backward comes first, into dtmp). */
    const float *dmlp = dres;
    if (sandwich) {
        MODEL_TRY(model_norm_backward(m, dtmp, model_grad(m, o->post_ffw), dres, a->d_raw, P + o->post_ffw,
                                      a->rstd_pf, T, C));
        dmlp = dtmp;
    }
    if (o->router >= 0) { /* a mixture-of-experts layer: dL/d(ln2) into dtmp */
        MODEL_TRY(model_moe_backward(m, l, a->ln2, dmlp, dtmp));
    } else {
        /* dL/dout packed once for the base's dX and the adapter's dY B (model_share) */
        model_share(m, 0, 0, dmlp, T, C, 1 + lora_reads(m, l, LORA_DOWN, 0));
        MODEL_TRY(model_linear_backward(m, d1, model_grad(m, o->wd), NULL, dmlp, a->h, P + o->wd, T, I, C));
        MODEL_TRY(lora_backward(m, l, LORA_DOWN, a, d1, dmlp, a->h, I, C));
        model_share_end(m);
        MODEL_TRY(model_act_backward(m, d2, d3, d1, a->g, a->u, (int64_t)T * I));
        /* ln2 packed once as the B of gate's and up's dW = dY^T ln2 (or their adapters' dA) */
        model_share(m, 1, 1, a->ln2, T, C,
                    dw_readers(m, l, o->wg, LORA_GATE) + dw_readers(m, l, o->wu, LORA_UP));
        model_share(m, 0, 0, d2, T, I, 1 + lora_reads(m, l, LORA_GATE, 0));
        MODEL_TRY(model_linear_backward(m, dtmp, model_grad(m, o->wg), NULL, d2, a->ln2, P + o->wg, T, C, I));
        MODEL_TRY(lora_backward(m, l, LORA_GATE, a, dtmp, d2, a->ln2, C, I));
        model_share(m, 0, 0, d3, T, I, 1 + lora_reads(m, l, LORA_UP, 0));
        MODEL_TRY(model_linear_backward(m, d1, model_grad(m, o->wu), NULL, d3, a->ln2, P + o->wu, T, C, I));
        MODEL_TRY(lora_backward(m, l, LORA_UP, a, d1, d3, a->ln2, C, I));
        model_share_end(m);
        MODEL_TRY(be->residual_forward(dtmp, dtmp, d1, (int64_t)T * C));
    }
    MODEL_TRY(model_norm_backward(m, d1, model_grad(m, o->ln2), dtmp, a->x_mid, P + o->ln2, a->rstd2, T, C));
    MODEL_TRY(be->residual_forward(dres, dres, d1, (int64_t)T * C)); /* now the gradient of x_mid */
    /* Attention: x_mid = x_in + o_proj(att) (Gemma 2: x_in + post_attn_norm(o_proj(att))). */
    const float *dattn = dres;
    if (sandwich) {
        MODEL_TRY(model_norm_backward(m, dtmp, model_grad(m, o->post_attn), dres, a->o_raw, P + o->post_attn,
                                      a->rstd_pa, T, C));
        dattn = dtmp;
    }
    model_share(m, 0, 0, dattn, T, C, 1 + lora_reads(m, l, LORA_O, 0));
    MODEL_TRY(
        model_linear_backward(m, d1, model_grad(m, o->wo), NULL, dattn, a->att, P + o->wo, T, H * D, C));
    MODEL_TRY(lora_backward(m, l, LORA_O, a, d1, dattn, a->att, H * D, C));
    model_share_end(m);
    ctrl_attention_args args = model_attention_args(m, l, a);
    args.dout = d1, args.dq = d2, args.dk = dk, args.dv = dv;
    ctrl_status st = m->attn->backward(&args, NULL);
    if (st != CTRL_OK) return ctrl_error_wrap(st, "layer %d attention backward", l);
    /* RoPE (then the per-head norms) back to the projections' outputs. */
    MODEL_TRY(model_rope(m, l, d2, d2, positions, T, H, 0));
    MODEL_TRY(model_rope(m, l, dk, dk, positions, T, HK, 0));
    if (c->qk_norm) {
        const int full = c->qk_norm == 2; /* OLMoE: over the whole projection */
        MODEL_TRY(model_norm_backward(m, d3, model_grad(m, o->q_norm), d2, a->q_raw, P + o->q_norm, a->q_rstd,
                                      full ? T : T * H, full ? H * D : D));
        MODEL_TRY(be->copy(d2, d3, sizeof(float) * (size_t)T * H * D));
        MODEL_TRY(model_norm_backward(m, d3, model_grad(m, o->k_norm), dk, a->k_raw, P + o->k_norm, a->k_rstd,
                                      full ? T : T * HK, full ? HK * D : D));
        MODEL_TRY(be->copy(dk, d3, sizeof(float) * (size_t)T * HK * D));
    }
    /* ln1 packed once as the B of q's, k's and v's dW = dY^T ln1 (or their adapters' dA) */
    model_share(m, 1, 1, a->ln1, T, C,
                dw_readers(m, l, o->wq, LORA_Q) + dw_readers(m, l, o->wk, LORA_K) +
                    dw_readers(m, l, o->wv, LORA_V));
    model_share(m, 0, 0, d2, T, H * D, 1 + lora_reads(m, l, LORA_Q, 0));
    MODEL_TRY(model_linear_backward(m, dtmp, model_grad(m, o->wq), model_grad(m, o->bq), d2, a->ln1,
                                    P + o->wq, T, C, H * D));
    MODEL_TRY(lora_backward(m, l, LORA_Q, a, dtmp, d2, a->ln1, C, H * D));
    model_share(m, 0, 0, dk, T, HK * D, 1 + lora_reads(m, l, LORA_K, 0));
    MODEL_TRY(model_linear_backward(m, d1, model_grad(m, o->wk), model_grad(m, o->bk), dk, a->ln1, P + o->wk,
                                    T, C, HK * D));
    MODEL_TRY(lora_backward(m, l, LORA_K, a, d1, dk, a->ln1, C, HK * D));
    MODEL_TRY(be->residual_forward(dtmp, dtmp, d1, (int64_t)T * C));
    model_share(m, 0, 0, dv, T, HK * D, 1 + lora_reads(m, l, LORA_V, 0));
    MODEL_TRY(model_linear_backward(m, d1, model_grad(m, o->wv), model_grad(m, o->bv), dv, a->ln1, P + o->wv,
                                    T, C, HK * D));
    MODEL_TRY(lora_backward(m, l, LORA_V, a, d1, dv, a->ln1, C, HK * D));
    model_share_end(m);
    MODEL_TRY(be->residual_forward(dtmp, dtmp, d1, (int64_t)T * C));
    MODEL_TRY(model_norm_backward(m, d1, model_grad(m, o->ln1), dtmp, a->x_in, P + o->ln1, a->rstd1, T, C));
    model_act16_clear(m); /* the layer's bf16 activations (model_act16_keep) are spent */
    return be->residual_forward(dres, dres, d1, (int64_t)T * C); /* now the gradient of x_in */
}

ctrl_status ctrl_model_backward(ctrl_model *m, const float *dlogp) {
    const ctrl_backend_ops *be = m->be;
    const ctrl_model_config *c = &m->cfg;
    const int T = m->T, C = c->hidden_size, I = c->intermediate_size, H = c->n_heads, HK = c->n_kv_heads,
              D = c->head_dim;
    if (T <= 0) return ctrl_error_set(CTRL_ERR_RUNTIME, "model: backward without a forward");
    if (dlogp && m->off_lm_head < 0)
        return ctrl_error_set(CTRL_ERR_RUNTIME,
                              "model: a sequence classifier has no LM head to take dL/dlogp");
    if (!dlogp && !m->head_dh_ready)
        return ctrl_error_set(CTRL_ERR_RUNTIME,
                              "model: backward without dL/dlogp after a forward that was not fused");
    const float *P = m->dparams;
    /* Scratch: residual-stream gradient, a second [T, C], [T, max(I, H*D)] x 3 and [T, HK*D] x 2;
     * kept between steps. After the one-pass head (dlogp NULL: its dhidden is in head_dh) the head's
     * workspace is spent until the next forward: the backward's scratch is that buffer, grown to
     * the larger of the two (one buffer instead of two: 65 MiB less at 1,024 tokens of Qwen2.5-0.5B). */
    const size_t wide = (size_t)T * (I > H * D ? I : H * D), per_T = 2 * (size_t)C + 2 * (size_t)HK * D,
                 floats = (size_t)T * per_T + 3 * wide;
    ctrl_status st = dlogp ? model_grow(m, (void **)&m->bwd_mem, &m->bwd_bytes, sizeof(float) * floats)
                           : model_grow(m, &m->head_ws, &m->head_ws_bytes, sizeof(float) * floats);
    if (st != CTRL_OK) return ctrl_error_wrap(st, "model: backward scratch for %d tokens", T);
    layer_grads g = {.dres = dlogp ? m->bwd_mem : (float *)m->head_ws};
    g.dtmp = g.dres + (size_t)T * C, g.d1 = g.dtmp + (size_t)T * C, g.d2 = g.d1 + wide, g.d3 = g.d2 + wide;
    g.dk = g.d3 + wide, g.dv = g.dk + (size_t)T * HK * D;
    if (dlogp) { /* else the fused forward did this part */
        ctrl_head_args ha = model_head_args(m);
        model_stage s;
        MODEL_TRY(model_grow(m, &m->head_ws, &m->head_ws_bytes, be->head_workspace_bytes(&ha)));
        MODEL_TRY(model_stage_in(m, &s, dlogp, NULL, NULL));
        MODEL_TRY(model_outer_hooks(m, 1, 1, 1)); /* ZeRO-3: the head gathered for its backward */
        ha = model_head_args(m);
        MODEL_TRY(be->head_backward(&ha, m->head_lse, s.dlogp, NULL, NULL, g.dtmp,
                                    model_grad(m, m->off_lm_head), m->head_ws));
        MODEL_TRY(model_outer_hooks(m, 1, 1, 0)); /* and released */
    }
    MODEL_TRY(model_norm_backward(m, g.dres, model_grad(m, m->off_norm), dlogp ? g.dtmp : m->head_dh,
                                  m->x_out, P + m->off_norm, m->rstdf, T, C));
    for (int l = c->n_layers - 1; l >= 0; l--) {
        MODEL_TRY(model_layer_hooks(m, l, 1, 1));
        MODEL_TRY(model_offload_input(m, l, 0)); /* an offloaded input back from host memory */
        if (model_recomputed(m, l)) {
            MODEL_TRY(model_layer_forward(m, l, NULL, model_plugin_attention, NULL));
            if (c->sandwich_norm) /* the recompute stops before post_feedforward_layernorm: its rstd */
                MODEL_TRY(model_norm_forward(m, g.dtmp, m->acts[l].rstd_pf, m->acts[l].d_raw,
                                             P + m->layers[l].post_ffw, T, C));
        }
        st = layer_backward(m, l, &g);
        model_share_end(m); /* on every return: no operand stays shared past the layer */
        MODEL_TRY(st);
        MODEL_TRY(model_layer_hooks(m, l, 1, 0));
    }
    model_share_release(m);                    /* the shared operands' memory (model_share) */
    m->moe_aux_armed = 0;                      /* its gradient is in the routers now */
    float *dwte = model_grad(m, m->off_embed); /* none when frozen (LoRA) */
    const int rows = dwte || m->tt_tokens;     /* the table's gradient, or trainable_token_indices' */
    if (rows && c->embed_scale > 0) MODEL_TRY(be->scale(g.dres, c->embed_scale, (int64_t)T * C));
    if (dwte) MODEL_TRY(be->embedding_backward(dwte, g.dres, m->grad_tokens, T, C));
    MODEL_TRY(lora_tokens_backward(m, g.dres));
    /* every gradient written: the sharding's end of the backward (ZeRO's last reduction) */
    if (m->shard_ops && m->shard_ops->after_backward) return m->shard_ops->after_backward(m->shard_mem, -1);
    return CTRL_OK;
}
