/* Where the model computes (see model.h, ctrl_model_to_device): its backend, the device copies of
 * the parameters and gradients, the backend scratch every other file grows through model_grow,
 * and the staging of per-token inputs and outputs between the host and a device. */
#include <stdlib.h>
#include <string.h>

#include "model/model_internal.h"

ctrl_status model_grow(const ctrl_model *m, void **buf, size_t *cap, size_t bytes) {
    if (bytes <= *cap && *buf) return CTRL_OK;
    m->be->free(*buf);
    *buf = NULL, *cap = 0;
    ctrl_status st = m->be->alloc(buf, bytes);
    if (st != CTRL_OK) return ctrl_error_wrap(st, "model: %zu bytes of scratch on %s", bytes, m->be->name);
    *cap = bytes;
    return CTRL_OK;
}

void ctrl_model_release_scratch(ctrl_model *m) {
    const ctrl_backend_ops *be = m->be;
    model_offload_release(m); /* the offloading copies in flight first */
    model_moe_release(m);     /* the mixture-of-experts layers' activations and scratch too */
    void **bufs[] = {(void **)&m->act_mem, (void **)&m->head_dh, (void **)&m->bwd_mem, (void **)&m->stage,
                     &m->head_ws,          (void **)&m->lora_ws, (void **)&m->dora_ws, (void **)&m->dora_norm,
                     (void **)&m->dora_g};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) be->free(*bufs[i]), *bufs[i] = NULL;
    model_act16_release(m); /* the activations' bf16 copies */
    m->act_cap_T = 0, m->act_bytes = 0, m->head_dh_ready = 0, m->T = 0, m->dora_valid = 0;
    m->head_ws_bytes = m->head_dh_bytes = m->bwd_bytes = m->stage_bytes = m->lora_ws_bytes =
        m->dora_ws_bytes = 0;
}

size_t ctrl_model_scratch_bytes(const ctrl_model *m) {
    return m->head_ws_bytes + m->head_dh_bytes + m->bwd_bytes + m->stage_bytes + m->lora_ws_bytes +
           m->dora_ws_bytes + m->moe_ws_bytes + ctrl_cpu_gemm_bf16_packed_bytes(m->head_keep);
}

size_t ctrl_model_bf16_copy_bytes(const ctrl_model *m) {
    return m->rounded ? sizeof(float) * m->n_params : m->wb16 ? sizeof(uint16_t) * m->n_params : 0;
}

void model_release_backend(ctrl_model *m) {
    const ctrl_backend_ops *be = m->be;
    nf4_release_device(m); /* QLoRA's device copy of the NF4 store */
    ctrl_model_release_scratch(m);
    if (m->dora_wn) be->free(m->dora_wn); /* QDoRA's base row norms: kept while the model stays here */
    m->dora_wn = NULL;
    ctrl_model_release_decode_scratch(m); /* on this backend too */
    lora_tokens_release(m);               /* trainable_token_indices' base rows there */
    lora_saved_release(m);                /* modules_to_save's base tables there (swapped back first) */
    void **bufs[] = {(void **)&m->cos_tab, (void **)&m->sin_tab, (void **)&m->rounded,
                     (void **)&m->dbatch_mem, (void **)&m->wb16};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) be->free(*bufs[i]), *bufs[i] = NULL;
    if (m->dparams != m->params && !m->dbufs_external) be->free(m->dparams);
    if (m->dgrads != m->grads && !m->dbufs_external) be->free(m->dgrads);
    m->dparams = m->params, m->dgrads = m->grads, m->dparams_valid = 1;
    m->dbufs_external = m->dparams_sliced = 0;
    m->ext_b16 = NULL, m->ext_ranges = NULL, m->n_ext = 0; /* ZeRO-3's bf16 matrices: the caller's */
    m->rope_len = 0, m->rounded_valid = 0, m->dbatch_bytes = 0;
}

ctrl_status ctrl_model_to_device(ctrl_model *m, const ctrl_backend_ops *be, ctrl_device device) {
    if (!be || be->size < offsetof(ctrl_backend_ops, scale) + sizeof be->scale)
        return ctrl_error_set(CTRL_ERR_DEVICE, "model: the %s backend's ops table is older than this libctrl",
                              be ? be->name : "(none)");
    if (m->linear_bf16 &&
        (!ctrl_backend_has(be, linear_forward_bf16) || !ctrl_backend_has(be, round_to_bf16)))
        return ctrl_error_set(CTRL_ERR_UNSUPPORTED, "model: bf16 compute is not implemented on %s yet",
                              be->name);
    if (m->nf4_w &&
        (!ctrl_backend_has(be, nf4_linear_forward) || !ctrl_backend_has(be, nf4_linear_backward) ||
         (!be->host_memory && !ctrl_backend_has(be, nf4_dequantize))))
        return ctrl_error_set(CTRL_ERR_UNSUPPORTED,
                              "model: QLoRA ([peft] quantization = nf4) is not implemented on %s", be->name);
    ctrl_status ok = model_check_backend(m, be); /* a family's ops (Gemma's) it may lack */
    if (ok != CTRL_OK) return ok;
    model_release_backend(m);
    m->be = be, m->device = device;
    if (be->host_memory) return CTRL_OK;
    const size_t bytes = m->n_params * sizeof(float), gbytes = (m->n_train ? m->n_train : 1) * sizeof(float);
    m->dparams = m->dgrads = NULL;
    ctrl_status st = CTRL_OK;
    if (!m->dev_deferred) { /* (deferred: ZeRO-3 hands its sliced buffers over, adopt_device_buffers) */
        st = be->alloc((void **)&m->dparams, bytes);
        if (st == CTRL_OK) st = be->alloc((void **)&m->dgrads, gbytes); /* the trainable ones' only */
        if (st == CTRL_OK) st = be->to_device(m->dparams, m->params, bytes);
        if (st == CTRL_OK) st = be->to_device(m->dgrads, m->grads, gbytes);
    }
    if (st != CTRL_OK) { /* back on the CPU, as it was */
        if (m->dparams) be->free(m->dparams);
        if (m->dgrads) be->free(m->dgrads);
        m->dparams = m->params, m->dgrads = m->grads;
        m->be = ctrl_backend_cpu(), m->device = (ctrl_device){CTRL_DEVICE_CPU, 0};
        return ctrl_error_wrap(st, "model: %zu parameters onto %s", m->n_params, be->name);
    }
    m->dparams_valid = 1;
    st = nf4_to_device(m); /* QLoRA: the NF4 store in the device's memory */
    if (st != CTRL_OK) {
        model_release_backend(m);
        m->be = ctrl_backend_cpu(), m->device = (ctrl_device){CTRL_DEVICE_CPU, 0};
        return ctrl_error_wrap(st, "model: QLoRA's NF4 weights onto %s", be->name);
    }
    return CTRL_OK;
}

ctrl_device ctrl_model_device(const ctrl_model *m) { return m->device; }

const ctrl_backend_ops *ctrl_model_backend(const ctrl_model *m) { return m->be; }

float *ctrl_model_device_grads(ctrl_model *m, size_t *n) {
    if (n) *n = m->n_train;
    return m->dgrads;
}

float *ctrl_model_device_params(ctrl_model *m) { return m->dparams; }

ctrl_status ctrl_model_grad_sum_squares(ctrl_model *m, double *out) {
    return m->be->sum_squares(m->dgrads, (int64_t)m->n_train, out);
}

ctrl_status ctrl_model_scale_grads(ctrl_model *m, float s) {
    return m->be->scale(m->dgrads, s, (int64_t)m->n_train);
}

void ctrl_model_device_weights_changed(ctrl_model *m) {
    m->rounded_valid = 0;
    m->dora_valid = 0;
    m->tt_valid = 0;
    m->dparams_valid = 1;
    m->host_stale = m->dparams != m->params;
}

ctrl_status ctrl_model_adopt_device_buffers(ctrl_model *m, float *params, float *grads) {
    if (m->be->host_memory || m->dbufs_external)
        return ctrl_error_set(CTRL_ERR_RUNTIME, "model: device buffers adopted on %s", m->be->name);
    m->be->free(m->dparams), m->be->free(m->dgrads);
    m->dparams = params, m->dgrads = grads, m->dbufs_external = 1;
    return CTRL_OK;
}

ctrl_status ctrl_model_adopt_host_grads(ctrl_model *m, float *grads) {
    if (m->dgrads != m->grads || !m->be->host_memory)
        return ctrl_error_set(CTRL_ERR_RUNTIME, "model: host gradients adopted off the CPU");
    if (!m->grads_external) free(m->grads);
    m->grads = m->dgrads = grads, m->grads_external = 1;
    return CTRL_OK;
}

void ctrl_model_set_device_sliced(ctrl_model *m, int sliced) { m->dparams_sliced = sliced; }

ctrl_status ctrl_model_params_to_host(ctrl_model *m) {
    if (!m->host_stale || m->dparams_sliced) return CTRL_OK; /* sliced: copied once whole again */
    ctrl_status st = m->be->to_host(m->params, m->dparams, m->n_params * sizeof(float));
    if (st != CTRL_OK) return ctrl_error_wrap(st, "model: %zu parameters from %s", m->n_params, m->be->name);
    m->host_stale = 0;
    return CTRL_OK;
}

ctrl_status ctrl_model_grads_to_host(ctrl_model *m) {
    return m->dgrads == m->grads ? CTRL_OK : m->be->to_host(m->grads, m->dgrads, m->n_train * sizeof(float));
}

ctrl_status model_stage_in(ctrl_model *m, model_stage *st, const float *dlogp, float *logp,
                           int32_t *correct) {
    *st = (model_stage){dlogp, logp, correct};
    if (m->be->host_memory) return CTRL_OK;
    const size_t T = (size_t)m->T;
    ctrl_status s = model_grow(m, (void **)&m->stage, &m->stage_bytes, 3 * T * sizeof(float));
    if (s != CTRL_OK) return s;
    st->logp = logp ? m->stage : NULL;
    st->dlogp = dlogp ? m->stage + T : NULL;
    st->correct = correct ? (int32_t *)(m->stage + 2 * T) : NULL;
    return dlogp ? m->be->to_device(m->stage + T, dlogp, T * sizeof(float)) : CTRL_OK;
}

ctrl_status model_stage_out(ctrl_model *m, const model_stage *st, float *logp, int32_t *correct) {
    if (m->be->host_memory) return CTRL_OK;
    const size_t T = (size_t)m->T;
    ctrl_status s = logp ? m->be->to_host(logp, st->logp, T * sizeof(float)) : CTRL_OK;
    return s == CTRL_OK && correct ? m->be->to_host(correct, st->correct, T * sizeof(int32_t)) : s;
}

/* The head's arguments for the last forward's batch. Every caller reads log-probs, entropies and
 * LSEs only where a target is (the trained tokens: a GRPO batch's completions, not its prompts), so
 * the head skips the other rows (targets_only); with bf16 on the CPU, the head's logits multiply by
 * decoding's panels of W while they are current (an online trainer's step decodes first). */
ctrl_head_args model_head_args(const ctrl_model *m) {
    const ctrl_model_config *c = &m->cfg;
    const float *w = m->dparams + m->off_lm_head;
    /* a bf16 table, tied: as values (w16) or as the head's panels (w_packed) */
    const int w16_only = m->off_lm_head >= 0 && model_embed16_holds(m, w);
    const int32_t *tt_rows; /* trainable_token_indices of the head (tied: the embedding's) */
    int tt_n;
    float *tt_dw;
    lora_tokens_head(m, &tt_rows, &tt_n, &tt_dw);
    return (ctrl_head_args){.hidden = m->lnf,
                            .w = w16_only ? NULL : w,
                            .targets = m->dev_batch.targets,
                            .T = m->T,
                            .C = c->hidden_size,
                            .V = c->vocab_size,
                            .temperature = m->temperature,
                            .bf16 = m->linear_bf16 && !model_bf16_as_fp32(m),

                            .softcap = c->final_softcap,
                            .targets_only = 1,
                            .w_packed = w16_only ? m->emb_panels /* then W's only copy */
                                        : m->be->host_memory && m->off_lm_head >= 0
                                            ? model_pack_valid(m, w, c->hidden_size, c->vocab_size)
                                            : NULL,
                            .w16 = w16_only ? m->emb16 : model_head_w16(m),
                            .tt_rows = tt_rows,
                            .tt_n = tt_n,
                            .tt_dw = tt_dw};
}

void ctrl_model_defer_device(ctrl_model *m) { m->dev_deferred = 1; }
