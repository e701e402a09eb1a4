/* The decoder's layout and forward (see model.h; the backward is model_backward.c), every op through
 * the backend ops table m->be, every activation in its memory. Each layer's input (the residual
 * stream) is kept for backward; its internal activations are kept too (layer_acts in
 * model_internal.h lists them with their shapes), unless a memory strategy asks for the layer to
 * be recomputed (activation checkpointing): then the layer runs on one shared set of internal
 * buffers, and backward runs the layer's forward again from its saved input before its backward.
 * Selective checkpointing (the strategy's keep_mlp): such a layer also keeps its gate_proj and
 * up_proj outputs (and their adapters' x A^T) in buffers of its own, and its recompute skips those
 * products. The kernels are deterministic, so the recomputed activations, and the gradients, are
 * identical. */
#include "model/model.h"

#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <ctrl/hugepages.h>
#include <ctrl/log.h>

#include "model/model_internal.h"

/* m->views has room for every view a layout can have (ctrl_model_create sizes it); a view past
 * that is counted, not written, and layout reports the bound as wrong. */
long model_add_view(ctrl_model *m, size_t *cursor, const char *name, int ndim, int64_t d0, int64_t d1,
                    int no_decay) {
    if (m->n_views >= m->cap_views) {
        m->n_views++;
        const size_t at = *cursor;
        *cursor += (size_t)(d0 * (ndim > 1 ? d1 : 1));
        return (long)at;
    }
    ctrl_param_view *v = &m->views[m->n_views++];
    snprintf(v->name, sizeof v->name, "%s", name);
    v->offset = *cursor;
    v->ndim = ndim;
    v->shape[0] = d0;
    v->shape[1] = ndim > 1 ? d1 : 1;
    v->numel = d0 * (ndim > 1 ? d1 : 1);
    v->no_decay = no_decay;
    v->lora = 0, v->nf4 = 0;
    *cursor += (size_t)v->numel;
    return (long)v->offset;
}

/* Lays out every parameter: embeddings, then each layer contiguously, then the final norm and
 * the LM head. With LoRA the trainable tensors come last: the modules_to_save (embeddings, LM head)
 * after the final norm, then the adapters; train_off marks where they start. */
static ctrl_status layout(ctrl_model *m) {
    const ctrl_model_config *c = &m->cfg;
    const int C = c->hidden_size, I = c->intermediate_size, H = c->n_heads, HK = c->n_kv_heads,
              D = c->head_dim;
    size_t cur = 0;
    char n[96];
    for (int t = 0; t < LORA_N_TARGETS; t++) m->nf4_slot[t] = -1;
    /* a tied table in modules_to_save (ensure_weight_tying): the embedding trains, the head is it */
    const int tied_saved = m->lora && c->tie_word_embeddings && m->lora->ensure_weight_tying &&
                           (m->lora->save_embed_tokens || m->lora->save_lm_head);
    const int save_embed = m->lora && (m->lora->save_embed_tokens || tied_saved),
              save_head = m->lora && m->lora->save_lm_head && !tied_saved, nf4 = m->lora && m->lora->nf4;
    if (!save_embed)
        m->off_embed = model_add_view(m, &cur, "model.embed_tokens.weight", 2, c->vocab_size, C, 0);
    for (int l = 0; l < c->n_layers; l++) {
        layer_offsets *o = &m->layers[l];
#define V(field, suffix, nd, a, b, nodecay)                                                                  \
    snprintf(n, sizeof n, "model.layers.%d.%s", l, suffix);                                                  \
    o->field = model_add_view(m, &cur, n, nd, a, b, nodecay)
/* a projection weight: in QLoRA every layer's view of it is the first layer's slot (model_nf4.c) */
#define W(field, suffix, nd, a, b, target)                                                                   \
    if (nf4 && m->nf4_slot[target] >= 0) {                                                                   \
        size_t at_ = (size_t)m->nf4_slot[target];                                                            \
        snprintf(n, sizeof n, "model.layers.%d.%s", l, suffix);                                              \
        o->field = model_add_view(m, &at_, n, nd, a, b, 0);                                                  \
    } else {                                                                                                 \
        V(field, suffix, nd, a, b, 0);                                                                       \
        if (nf4) m->nf4_slot[target] = o->field;                                                             \
    }                                                                                                        \
    if (nf4 && m->n_views <= m->cap_views) m->views[m->n_views - 1].nf4 = 1 + l * LORA_N_TARGETS + (target)
        V(ln1, "input_layernorm.weight", 1, C, 0, 1);
        o->bq = o->bk = o->bv = o->q_norm = o->k_norm = -1;
        if (c->fused_qkv) { /* Phi-3: q, k, v are the row blocks of qkv_proj (one adapter: lora.c) */
            W(wq, "self_attn.qkv_proj.weight", 2, (H + 2 * HK) * D, C, LORA_Q); /* QLoRA: one NF4 tensor */
            o->wk = o->wq + (long)H * D * C, o->wv = o->wk + (long)HK * D * C;
        } else {
            W(wq, "self_attn.q_proj.weight", 2, H * D, C, LORA_Q);
        }
        if (c->qkv_bias) {
            V(bq, "self_attn.q_proj.bias", 1, H * D, 0, 1);
        }
        if (!c->fused_qkv) {
            W(wk, "self_attn.k_proj.weight", 2, HK * D, C, LORA_K);
        }
        if (c->qkv_bias) {
            V(bk, "self_attn.k_proj.bias", 1, HK * D, 0, 1);
        }
        if (!c->fused_qkv) {
            W(wv, "self_attn.v_proj.weight", 2, HK * D, C, LORA_V);
        }
        if (c->qkv_bias) {
            V(bv, "self_attn.v_proj.bias", 1, HK * D, 0, 1);
        }
        W(wo, "self_attn.o_proj.weight", 2, C, H * D, LORA_O);
        if (c->qk_norm) {
            V(q_norm, "self_attn.q_norm.weight", 1, c->qk_norm == 2 ? H * D : D, 0,
              1); /* OLMoE: whole q, k */
            V(k_norm, "self_attn.k_norm.weight", 1, c->qk_norm == 2 ? HK * D : D, 0, 1);
        }
        o->post_attn = o->post_ffw = -1;
        if (c->sandwich_norm) { /* Gemma 2: post_attention_layernorm is after attention */
            V(post_attn, "post_attention_layernorm.weight", 1, C, 0, 1);
            V(ln2, "pre_feedforward_layernorm.weight", 1, C, 0, 1);
            V(post_ffw, "post_feedforward_layernorm.weight", 1, C, 0, 1);
        } else {
            V(ln2, "post_attention_layernorm.weight", 1, C, 0, 1);
        }
        o->router = o->experts = -1;
        if (c->n_experts > 0 && c->moe_layer[l]) { /* the router, then each expert's gate, up, down */
            const int E = c->n_experts, Im = c->moe_intermediate_size;
            const int mixtral = c->arch == CTRL_ARCH_MIXTRAL; /* block_sparse_moe, experts.E.w1/w3/w2 */
            if (mixtral) {
                V(router, "block_sparse_moe.gate.weight", 2, E, C, 0);
            } else {
                V(router, "mlp.gate.weight", 2, E, C, 0);
            }
            o->wg = o->wu = o->wd = -1;
            static const char *const parts[2][3] = {
                {"mlp.experts.%d.gate_proj", "mlp.experts.%d.up_proj", "mlp.experts.%d.down_proj"},
                {"block_sparse_moe.experts.%d.w1", "block_sparse_moe.experts.%d.w3",
                 "block_sparse_moe.experts.%d.w2"}};
            for (int e = 0; e < E; e++)
                for (int p = 0; p < 3; p++) { /* expert e's tensor p at experts + (3 e + p) Im C */
                    char part[64];
                    snprintf(part, sizeof part, parts[mixtral][p], e);
                    snprintf(n, sizeof n, "model.layers.%d.%s.weight", l, part);
                    const long at = model_add_view(m, &cur, n, 2, p < 2 ? Im : C, p < 2 ? C : Im, 0);
                    if (e == 0 && p == 0) o->experts = at;
                }
            continue;
        }
        if (c->fused_gate_up) { /* Phi-3: gate then up, the row blocks of gate_up_proj */
            W(wg, "mlp.gate_up_proj.weight", 2, 2 * I, C, LORA_GATE);
            o->wu = o->wg + (long)I * C;
        } else {
            W(wg, "mlp.gate_proj.weight", 2, I, C, LORA_GATE);
            W(wu, "mlp.up_proj.weight", 2, I, C, LORA_UP);
        }
        W(wd, "mlp.down_proj.weight", 2, C, I, LORA_DOWN);
#undef W
#undef V
    }
    m->off_norm = model_add_view(m, &cur, "model.norm.weight", 1, C, 0, 1);
    m->off_score = m->off_lm_head = -1; /* a sequence classifier has the score, not the LM head */
    if (c->num_labels > 0 && !m->lora)
        m->off_score = model_add_view(m, &cur, "score.weight", 2, c->num_labels, C, 0);
    else if (c->num_labels <= 0 && !c->tie_word_embeddings && !save_head)
        m->off_lm_head = model_add_view(m, &cur, "lm_head.weight", 2, c->vocab_size, C, 0);
    if (m->lora) m->train_off = cur;
    if (c->num_labels > 0 && m->lora) /* PEFT's SEQ_CLS: the score among the modules_to_save */
        m->off_score = model_add_view(m, &cur, "score.weight", 2, c->num_labels, C, 0);
    if (save_embed)
        m->off_embed = model_add_view(m, &cur, "model.embed_tokens.weight", 2, c->vocab_size, C, 0);
    if (c->num_labels <= 0 && c->tie_word_embeddings)
        m->off_lm_head = m->off_embed;
    else if (c->num_labels <= 0 && save_head)
        m->off_lm_head = model_add_view(m, &cur, "lm_head.weight", 2, c->vocab_size, C, 0);
    if (m->lora) MODEL_TRY(lora_layout(m, &cur));
    MODEL_TRY(lora_tokens_layout(m, &cur)); /* trainable_token_indices' rows */
    lora_saved_layout(m);                   /* modules_to_save's tables: their base's values aside */
    m->n_params = cur;
    m->n_train = cur - m->train_off;
    if (m->n_views > m->cap_views)
        return ctrl_error_set(CTRL_ERR_RUNTIME,
                              "model: %d parameter views, room for %d (a bug in the layout's bound)",
                              m->n_views, m->cap_views);
    return CTRL_OK;
}

ctrl_status ctrl_model_create(const ctrl_model_config *cfg, const ctrl_attention_ops *attn,
                              ctrl_model **out) {
    return ctrl_model_create_lora(cfg, attn, NULL, out);
}

ctrl_status ctrl_model_create_lora(const ctrl_model_config *cfg, const ctrl_attention_ops *attn,
                                   const ctrl_lora_config *lora, ctrl_model **out) {
    *out = NULL;
    if (lora && lora->r < 1) return ctrl_error_set(CTRL_ERR_CONFIG, "LoRA: r = %d, must be >= 1", lora->r);
    if (lora && lora->seq_cls && cfg->num_labels <= 0)
        return ctrl_error_set(CTRL_ERR_CONFIG,
                              "LoRA: modules_to_save score / task_type SEQ_CLS on %s, a causal LM: the "
                              "score head is a sequence classifier's (trainer = reward)",
                              cfg->model_type);
    if (lora && lora->save_lm_head && cfg->num_labels > 0)
        return ctrl_error_set(CTRL_ERR_CONFIG,
                              "LoRA: modules_to_save lm_head on a sequence classifier (num_labels = %d), "
                              "which has a score head and no LM head",
                              cfg->num_labels);
    if (lora && cfg->tie_word_embeddings && (lora->save_embed_tokens || lora->save_lm_head) &&
        !lora->ensure_weight_tying)
        return ctrl_error_set(
            CTRL_ERR_UNSUPPORTED,
            "LoRA: modules_to_save with tied word embeddings (tie_word_embeddings = true) and "
            "ensure_weight_tying false: PEFT would untie them (not implemented); set ensure_weight_tying = "
            "true "
            "to train the one table that is both, or train rows of it (trainable_token_indices)");
    /* attn may be NULL for a model that is only initialised or converted; forward needs one. */
    if (attn && (!attn->forward || !attn->backward))
        return ctrl_error_set(CTRL_ERR_PLUGIN,
                              "model: the attention plugin has no training forward/backward (`paged` only "
                              "decodes: use eager or flash)");
    /* refused before anything is allocated: a shape no machine here could hold */
    const uint64_t n = ctrl_model_config_param_count(cfg);
    const double need = 4.0 * (double)n,
                 have = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
    if (have > 0 && need > have)
        return ctrl_error_set(
            CTRL_ERR_NOMEM,
            "model: %llu parameters need %.1f GiB of fp32 weights, more than this machine's "
            "%.1f GiB of memory",
            (unsigned long long)n, need / (1 << 30), have / (1 << 30));
    ctrl_model *m = calloc(1, sizeof *m);
    if (!m) return ctrl_error_set(CTRL_ERR_NOMEM, "model: out of memory");
    m->cfg = *cfg;
    m->attn = attn;
    m->temperature = 1.0f;
    m->embed_pad = cfg->pad_token_id; /* fixed at construction, as nn.Embedding's padding_idx */
    m->layers = calloc((size_t)cfg->n_layers, sizeof *m->layers);
    m->acts = calloc((size_t)cfg->n_layers, sizeof *m->acts);
    /* every view a layer can have (and its adapters): layout never grows it */
    m->cap_views = 5 + (17 + 3 * cfg->n_experts +
                        (lora ? (2 + !!lora->use_dora + !!lora->lora_bias) * LORA_N_TARGETS + 4 : 0)) *
                           cfg->n_layers;
    m->views = malloc(sizeof *m->views * (size_t)m->cap_views);
    if (lora) {
        m->has_lora = 1, m->lora = malloc(sizeof *m->lora);
        m->lora_a = malloc(sizeof(long) * LORA_N_TARGETS * (size_t)cfg->n_layers);
        m->lora_b = malloc(sizeof(long) * LORA_N_TARGETS * (size_t)cfg->n_layers);
        m->lora_rank = calloc(LORA_N_TARGETS * (size_t)cfg->n_layers, sizeof(int));
        m->lora_scales = calloc(LORA_N_TARGETS * (size_t)cfg->n_layers, sizeof(float));
        m->lora_bb = malloc(sizeof(long) * LORA_N_TARGETS * (size_t)cfg->n_layers);
        if (cfg->n_experts > 0) m->moe_lora = malloc(sizeof(long) * 4 * (size_t)cfg->n_layers);
        if (m->lora) *m->lora = *lora, m->lora_scale = ctrl_lora_scaling(lora);
        if (m->lora && cfg->num_labels > 0) m->lora->seq_cls = 1; /* PEFT's SEQ_CLS: the score trains */
        if (lora->use_dora) {
            m->lora_mag = malloc(sizeof(long) * LORA_N_TARGETS * (size_t)cfg->n_layers);
            m->dora_at = malloc(sizeof(long) * LORA_N_TARGETS * (size_t)cfg->n_layers);
        }
    }
    if (!m->layers || !m->acts || !m->views ||
        (lora && (!m->lora || !m->lora_a || !m->lora_b || !m->lora_rank || !m->lora_scales || !m->lora_bb)) ||
        (lora && cfg->n_experts > 0 && !m->moe_lora) ||
        (lora && lora->use_dora && (!m->lora_mag || !m->dora_at))) {
        ctrl_model_free(m);
        return ctrl_error_set(CTRL_ERR_NOMEM, "model: cannot allocate the layout of %d layers",
                              cfg->n_layers);
    }
    ctrl_status st = layout(m);
    if (st != CTRL_OK) {
        ctrl_model_free(m);
        return st;
    }
    m->params = ctrl_calloc_huge(m->n_params, sizeof(float));
    m->grads = ctrl_calloc_huge(m->n_train ? m->n_train : 1, sizeof(float));
    if (!m->params || !m->grads) {
        const size_t n_params = m->n_params; /* read before the model is freed */
        ctrl_model_free(m);
        return ctrl_error_set(CTRL_ERR_NOMEM, "model: cannot allocate %zu parameters and their gradients",
                              n_params);
    }
    /* on the CPU until ctrl_model_to_device: the backend's parameters are the host's */
    m->be = ctrl_backend_cpu(), m->device = (ctrl_device){CTRL_DEVICE_CPU, 0};
    m->dparams = m->params, m->dgrads = m->grads, m->dparams_valid = 1;
    if (lora) lora_init(m);
    *out = m;
    return CTRL_OK;
}

void ctrl_model_free(ctrl_model *m) {
    if (!m) return;
    if (m->be) model_release_backend(m);
    model_share_release(m); /* this thread's shared operands' memory (model_share.c) */
    free(m->recompute);
    model_offload_close(m);
    if (!m->grads_external) free(m->grads);
    free(m->params), free(m->views), free(m->layers), free(m->acts);
    free(m->lora), free(m->lora_a), free(m->lora_b), free(m->lora_host), free(m->moe_lora);
    free(m->lora_rank), free(m->lora_scales), free(m->lora_bb);
    free(m->lora_mag), free(m->dora_at); /* dora_norm, dora_g: backend memory (released above) */
    lora_tokens_free(m), lora_saved_free(m);
    free(m->dora_pending), free(m->dora_wn_host);
    lora_bank_free(m);
    nf4_free(m);
    model_bf16_free(m);
    free(m->batch_mem);
    free(m->dec_mem), free(m->dec_acts), free(m->dec_pos);
    free(m->source_config), free(m->source_generation);
    free(m);
}

const ctrl_model_config *ctrl_model_cfg(const ctrl_model *m) { return &m->cfg; }
float *ctrl_model_params(ctrl_model *m, size_t *n) {
    if (n) *n = m->n_params;
    if (m->host_stale && ctrl_model_params_to_host(m) != CTRL_OK) CTRL_ERROR("%s", ctrl_error_message());
    return m->params;
}
float *ctrl_model_grads(ctrl_model *m, size_t *n) {
    if (n) *n = m->n_train;
    return m->grads;
}
const ctrl_lora_config *ctrl_model_lora(const ctrl_model *m) { return m->lora; }
size_t ctrl_model_trainable_offset(const ctrl_model *m) { return m->train_off; }
void ctrl_model_set_training(ctrl_model *m, int training, uint64_t step) {
    m->training = training;
    if (training) m->lora_step = step << 24;
}
void ctrl_model_set_adapters_enabled(ctrl_model *m, int enabled) {
    m->lora_off = !enabled;
    /* modules_to_save's trained tables back at once (lora_saved.c): what reads them next may be a save */
    if (enabled && m->saved_off && lora_saved_sync(m) != CTRL_OK)
        CTRL_ERROR("LoRA: the adapters back on: %s", ctrl_error_message());
}
int ctrl_model_view_count(const ctrl_model *m) { return m->n_views; }
const ctrl_param_view *ctrl_model_view(const ctrl_model *m, int i) {
    return i >= 0 && i < m->n_views ? &m->views[i] : NULL;
}
const ctrl_param_view *ctrl_model_find_view(const ctrl_model *m, const char *name) {
    for (int i = 0; i < m->n_views; i++)
        if (!strcmp(m->views[i].name, name)) return &m->views[i];
    return NULL;
}
void ctrl_model_set_temperature(ctrl_model *m, float temperature) { m->temperature = temperature; }

ctrl_status ctrl_model_zero_grad(ctrl_model *m) {
    /* On a device the host's copy is only ever overwritten whole (ctrl_model_grads_to_host): clearing
     * it too, the model's size every step on one host thread, was two thirds of a GPU step's time. */
    if (m->dgrads != m->grads) return m->be->fill_zero(m->dgrads, m->n_train * sizeof(float));
    memset(m->grads, 0, m->n_train * sizeof(float));
    return CTRL_OK;
}

/* The tables are made on the host (once per length) and copied to a device. */
ctrl_status model_ensure_rope(ctrl_model *m, int max_pos) {
    /* longrope switches to its long factors once the sequence seen (max_pos, the largest position + 1)
     * outgrows the trained context, and back, as transformers' longrope_frequency_update */
    ctrl_rope_params rope = m->cfg.rope, local = m->cfg.rope_local;
    rope.use_long = local.use_long = max_pos > rope.original_max_position;
    const int use_long = rope.kind == CTRL_ROPE_LONGROPE && rope.use_long;
    if (max_pos <= m->rope_len && use_long == m->rope_long) return CTRL_OK;
    int len = 256;
    while (len < max_pos || len < m->rope_len) len *= 2;
    /* rope_dim / 2 columns (partial rotary); with two RoPEs (Gemma 3) the local tables follow the
     * global ones in the same buffers */
    const int dim = ctrl_model_rope_dim(&m->cfg);
    const size_t one = sizeof(float) * (size_t)len * (size_t)(dim / 2),
                 bytes = one * (m->cfg.local_rope ? 2 : 1);
    m->be->free(m->cos_tab), m->be->free(m->sin_tab);
    m->cos_tab = m->sin_tab = NULL, m->rope_len = 0;
    ctrl_status st = m->be->alloc((void **)&m->cos_tab, bytes);
    if (st == CTRL_OK) st = m->be->alloc((void **)&m->sin_tab, bytes);
    if (st != CTRL_OK) return ctrl_error_wrap(st, "model: RoPE tables for %d positions", len);
    float *cos_h = m->cos_tab, *sin_h = m->sin_tab;
    if (!m->be->host_memory && (!(cos_h = malloc(bytes)) || !(sin_h = malloc(bytes)))) {
        free(cos_h);
        return ctrl_error_set(CTRL_ERR_NOMEM, "model: RoPE tables for %d positions", len);
    }
    ctrl_cpu_rope_tables(cos_h, sin_h, len, dim, &rope);
    if (m->cfg.local_rope)
        ctrl_cpu_rope_tables(cos_h + one / sizeof(float), sin_h + one / sizeof(float), len, dim, &local);
    if (!m->be->host_memory) {
        st = m->be->to_device(m->cos_tab, cos_h, bytes);
        if (st == CTRL_OK) st = m->be->to_device(m->sin_tab, sin_h, bytes);
        free(cos_h), free(sin_h);
        if (st != CTRL_OK) return st;
    }
    m->rope_len = len, m->rope_long = use_long;
    return CTRL_OK;
}

ctrl_status ctrl_model_set_memory(ctrl_model *m, const ctrl_memory_ops *ops, ctrl_memory *mem) {
    free(m->recompute);
    m->recompute = NULL, m->n_recompute = 0, m->mem_ops = NULL, m->mem = NULL;
    m->act_cap_T = 0; /* the activation layout changes */
    if (!ops) return CTRL_OK;
    if (!(m->recompute = calloc((size_t)m->cfg.n_layers, 1)))
        return ctrl_error_set(CTRL_ERR_NOMEM, "model: memory strategy flags for %d layers", m->cfg.n_layers);
    m->mem_ops = ops, m->mem = mem;
    const int keep = ops->size >= offsetof(ctrl_memory_ops, keep_mlp) + sizeof ops->keep_mlp && ops->keep_mlp;
    for (int l = 0; ops->recompute && l < m->cfg.n_layers; l++) {
        m->recompute[l] = ops->recompute(mem, l) != 0;
        if (m->recompute[l] && keep && ops->keep_mlp(mem, l)) m->recompute[l] |= 2;
        m->n_recompute += m->recompute[l] != 0;
    }
    return CTRL_OK;
}

ctrl_status ctrl_model_set_sharding(ctrl_model *m, const ctrl_memory_ops *ops, ctrl_memory *mem) {
    m->shard_ops = ops, m->shard_mem = mem, m->shard_outer = 0;
    return CTRL_OK;
}

void ctrl_model_set_sharding_outer(ctrl_model *m, int on) { m->shard_outer = on != 0; }

/* The layer hooks, the sharding's around the memory strategy's: `before` says which side. */
ctrl_status model_layer_hooks(ctrl_model *m, int layer, int backward, int before) {
    typedef ctrl_status (*hook)(ctrl_memory *, int);
    const ctrl_memory_ops *ops[2] = {m->shard_ops, m->mem_ops};
    ctrl_memory *mem[2] = {m->shard_mem, m->mem};
    for (int k = 0; k < 2; k++) {
        const int i = before ? k : 1 - k;
        if (!ops[i]) continue;
        const hook h = before ? (backward ? ops[i]->before_backward : ops[i]->before_forward)
                              : (backward ? ops[i]->after_backward : ops[i]->after_forward);
        if (h) MODEL_TRY(h(mem[i], layer));
    }
    return before ? dora_layer_ready(m, layer) : CTRL_OK; /* ZeRO-3: DoRA's norms of the layer now whole */
}

int model_outer_slot(const ctrl_model *m, int head) {
    return m->cfg.n_layers + (head && m->off_lm_head != m->off_embed);
}

ctrl_status model_outer_hooks(ctrl_model *m, int head, int backward, int before) {
    typedef ctrl_status (*hook)(ctrl_memory *, int);
    const ctrl_memory_ops *o = m->shard_ops;
    if (!o || !m->shard_outer) return CTRL_OK;
    const hook h = before ? (backward ? o->before_backward : o->before_forward) : o->after_forward;
    return h ? h(m->shard_mem, model_outer_slot(m, head)) : CTRL_OK;
}

ctrl_status ctrl_model_set_recompute_all(ctrl_model *m) {
    ctrl_status st = ctrl_model_set_memory(m, NULL, NULL);
    if (st == CTRL_OK && !(m->recompute = malloc((size_t)m->cfg.n_layers)))
        st = ctrl_error_set(CTRL_ERR_NOMEM, "model: recompute flags for %d layers", m->cfg.n_layers);
    if (st != CTRL_OK) return st;
    memset(m->recompute, 1, (size_t)m->cfg.n_layers);
    m->n_recompute = m->cfg.n_layers;
    return CTRL_OK;
}

size_t ctrl_model_activation_bytes(const ctrl_model *m) { return m->act_bytes; }

/* Activation memory for T tokens, carved into the per-layer views: every layer's input, and the
 * internals of each layer that is not recomputed, plus one shared set for those that are. */
ctrl_status model_ensure_acts(ctrl_model *m, int T) {
    const ctrl_model_config *c = &m->cfg;
    const size_t C = c->hidden_size, I = c->intermediate_size, QD = (size_t)c->n_heads * c->head_dim,
                 KD = (size_t)c->n_kv_heads * c->head_dim;
    const size_t internals = 4 * C + 2 + 3 * QD + 4 * KD + c->n_heads + c->n_kv_heads + c->n_heads + 3 * I +
                             model_arch_act_floats(c);
    const size_t top = 2 * C + 3;
    if (T <= m->act_cap_T) return CTRL_OK;
    const int kept = c->n_layers - m->n_recompute, shared = m->n_recompute > 0;
    const int offload = m->offload_acts && m->n_recompute > 0;
    /* offloaded: the recomputed layers' inputs in two slots, the rest of each in host memory or a file */
    const size_t inputs = offload ? (size_t)(c->n_layers - m->n_recompute + 2) : (size_t)c->n_layers;
    size_t lora = shared ? lora_act_floats(m, -1) : 0; /* the adapters' s * x A^T: see layer_acts */
    for (int l = 0; l < c->n_layers; l++) lora += model_recomputed(m, l) ? 0 : lora_act_floats(m, l);
    size_t mlp = 0; /* selective checkpointing: the recomputed layers' gate/up outputs and their xa */
    for (int l = 0; l < c->n_layers; l++)
        if (model_keeps_mlp(m, l))
            for (int t = LORA_GATE; t <= LORA_UP; t++) mlp += I + (m->has_lora ? (size_t)lora_r(m, l, t) : 0);
    const size_t floats = (size_t)T * (C * inputs + internals * (kept + shared) + top + lora + mlp);
    model_offload_release(m); /* the copies in flight first */
    m->be->free(m->act_mem);
    m->act_mem = NULL, m->act_cap_T = 0, m->act_bytes = 0;
    ctrl_status st = m->be->alloc((void **)&m->act_mem, sizeof(float) * floats);
    if (st != CTRL_OK) return ctrl_error_wrap(st, "model: activations for %d tokens", T);
    if (offload) MODEL_TRY(model_offload_store(m, T));
    m->act_bytes = sizeof(float) * floats;
    float *p = m->act_mem;
#define TAKE(n) (p += (size_t)T * (n), p - (size_t)T * (n))
    layer_acts work = {0};
    float *slot[2] = {NULL, NULL};
    if (offload) slot[0] = TAKE(C), slot[1] = TAKE(C);
    for (int l = -1; l < c->n_layers; l++) { /* l = -1: the shared set */
        if (l >= 0) m->acts[l].x_in = offload && model_recomputed(m, l) ? slot[l % 2] : TAKE(C);
        if (l < 0 ? !shared : model_recomputed(m, l)) {
            if (l >= 0) { /* internals in the shared set */
                float *x_in = m->acts[l].x_in;
                m->acts[l] = work, m->acts[l].x_in = x_in;
            }
            if (l >= 0 && model_keeps_mlp(m, l)) { /* but gate/up's outputs (and xa) its own */
                layer_acts *a = &m->acts[l];
                a->g = TAKE(I), a->u = TAKE(I);
                for (int t = LORA_GATE; t <= LORA_UP; t++)
                    if (m->has_lora && lora_r(m, l, t) > 0) a->lora_xa[t] = TAKE(lora_r(m, l, t));
            }
            continue;
        }
        layer_acts *a = l < 0 ? &work : &m->acts[l];
        a->ln1 = TAKE(C), a->rstd1 = TAKE(1), a->q_raw = TAKE(QD), a->k_raw = TAKE(KD);
        a->q_rstd = TAKE(c->n_heads), a->k_rstd = TAKE(c->n_kv_heads), a->q = TAKE(QD), a->k = TAKE(KD);
        a->v = TAKE(KD), a->att = TAKE(QD), a->lse = TAKE(c->n_heads), a->x_mid = TAKE(C), a->ln2 = TAKE(C);
        a->rstd2 = TAKE(1), a->g = TAKE(I), a->u = TAKE(I), a->h = TAKE(I);
        model_arch_take_acts(c, a, &p, T);
        for (int t = 0; t < LORA_N_TARGETS; t++) a->lora_xa[t] = NULL;
        for (int t = 0, ll = l < 0 ? -1 : l; m->has_lora && t < LORA_N_TARGETS; t++) {
            int r = 0; /* the shared set has room for any layer's */
            for (int k = 0; k < c->n_layers; k++)
                if ((ll < 0 ? model_recomputed(m, k) : k == ll) && lora_r(m, k, t) > r) r = lora_r(m, k, t);
            if (r) a->lora_xa[t] = TAKE(r);
        }
    }
    m->x_out = TAKE(C), m->lnf = TAKE(C), m->rstdf = TAKE(1), m->head_lse = TAKE(1), m->head_ent = TAKE(1);
#undef TAKE
    m->act_cap_T = T;
    return CTRL_OK;
}

ctrl_attention_args model_attention_args(const ctrl_model *m, int l, const layer_acts *a) {
    const ctrl_model_config *c = &m->cfg;
    ctrl_attention_args args = {.size = sizeof args,
                                .device = m->device,
                                .dtype = CTRL_F32,
                                .n_seqs = m->batch.B,
                                .cu_seqlens = m->dev_batch.cu_seqlens,
                                .cu_seqlens_host = m->batch.cu_seqlens,
                                .total_tokens = m->T,
                                .n_head = c->n_heads,
                                .n_kv_head = c->n_kv_heads,
                                .head_dim = c->head_dim,
                                .scale = c->attn_scale > 0 ? c->attn_scale : 1.0f / sqrtf((float)c->head_dim),
                                .causal = 1,
                                .window = ctrl_model_layer_window(c, l),
                                .q = a->q,
                                .k = a->k,
                                .v = a->v,
                                .out = a->att,
                                .lse = a->lse,
                                .softcap = c->attn_softcap,
                                .compute_bf16 = m->linear_bf16};
    return args;
}

static ctrl_status check_batch(const ctrl_model *m, const ctrl_batch *b) {
    if (b->T <= 0 || b->B <= 0 || b->cu_seqlens[0] != 0 || b->cu_seqlens[b->B] != b->T)
        return ctrl_error_set(CTRL_ERR_RUNTIME, "model: malformed batch (T=%d, B=%d)", b->T, b->B);
    for (int i = 0; i < b->T; i++) {
        if (b->tokens[i] < 0 || b->tokens[i] >= m->cfg.vocab_size)
            return ctrl_error_set(CTRL_ERR_RUNTIME,
                                  "model: token %d at position %d is outside the vocabulary (%d)",
                                  b->tokens[i], i, m->cfg.vocab_size);
        if (b->positions[i] < 0) return ctrl_error_set(CTRL_ERR_RUNTIME, "model: negative position at %d", i);
    }
    return CTRL_OK;
}

ctrl_status model_plugin_attention(ctrl_model *m, int l, layer_acts *a, void *ctx) {
    (void)ctx;
    ctrl_attention_args args = model_attention_args(m, l, a);
    ctrl_status st = m->attn->forward(&args, NULL);
    return st == CTRL_OK ? CTRL_OK : ctrl_error_wrap(st, "layer %d attention", l);
}

static ctrl_status layer_forward(ctrl_model *m, int l, float *next, model_attention_fn attend, void *ctx) {
    const ctrl_backend_ops *be = m->be;
    const ctrl_model_config *c = &m->cfg;
    const int T = m->T, C = c->hidden_size, I = c->intermediate_size, H = c->n_heads, HK = c->n_kv_heads,
              D = c->head_dim;
    const float *P = m->dparams;
    const int32_t *positions = m->dev_batch.positions;
    const layer_offsets *o = &m->layers[l];
    layer_acts *a = &m->acts[l];
    if (m->nf4_w) MODEL_TRY(nf4_use_layer(m, l));          /* QLoRA: this layer's NF4 weights */
    if (m->w16) MODEL_TRY(model_bf16_layer_weights(m, l)); /* held in bf16: this layer's, widened */
    const int sandwich = c->sandwich_norm;
    model_act16_clear(m); /* the buffers the bf16 copies were made from are written again below */
    MODEL_TRY(model_norm_forward(m, a->ln1, a->rstd1, a->x_in, P + o->ln1, T, C));
    MODEL_TRY(model_act16_keep(m, MODEL_ACT16_LN1, a->ln1, (int64_t)T * C)); /* q, k, v and their dW */
    model_share(m, 0, 0, a->ln1, T, C, 3); /* packed once for q, k, v and their adapters' x A^T */
    MODEL_TRY(
        model_linear_forward(m, a->q_raw, a->ln1, P + o->wq, o->bq >= 0 ? P + o->bq : NULL, T, C, H * D));
    MODEL_TRY(lora_forward(m, l, LORA_Q, a, a->q_raw, a->ln1, C, H * D));
    MODEL_TRY(
        model_linear_forward(m, a->k_raw, a->ln1, P + o->wk, o->bk >= 0 ? P + o->bk : NULL, T, C, HK * D));
    MODEL_TRY(lora_forward(m, l, LORA_K, a, a->k_raw, a->ln1, C, HK * D));
    MODEL_TRY(model_linear_forward(m, a->v, a->ln1, P + o->wv, o->bv >= 0 ? P + o->bv : NULL, T, C, HK * D));
    MODEL_TRY(lora_forward(m, l, LORA_V, a, a->v, a->ln1, C, HK * D));
    model_share_end(m);
    const float *qin = a->q_raw, *kin = a->k_raw;
    if (c->qk_norm) {                     /* per-head RMSNorm, then RoPE (Qwen3) */
        const int full = c->qk_norm == 2; /* OLMoE: over the whole projection, rstd [T] */
        MODEL_TRY(model_norm_forward(m, a->q, a->q_rstd, a->q_raw, P + o->q_norm, full ? T : T * H,
                                     full ? H * D : D));
        MODEL_TRY(model_norm_forward(m, a->k, a->k_rstd, a->k_raw, P + o->k_norm, full ? T : T * HK,
                                     full ? HK * D : D));
        qin = a->q, kin = a->k;
    }
    MODEL_TRY(model_rope(m, l, a->q, qin, positions, T, H, 1));
    MODEL_TRY(model_rope(m, l, a->k, kin, positions, T, HK, 1));
    MODEL_TRY(attend(m, l, a, ctx));
    MODEL_TRY(model_act16_keep(m, MODEL_ACT16_ATT, a->att, (int64_t)T * H * D));
    float *attn_out = sandwich ? a->o_raw : a->x_mid; /* Gemma 2 norms it into x_mid */
    model_share(m, 0, 0, a->att, T, H * D, 1 + lora_reads(m, l, LORA_O, 1));
    MODEL_TRY(model_linear_forward(m, attn_out, a->att, P + o->wo, NULL, T, H * D, C));
    MODEL_TRY(lora_forward(m, l, LORA_O, a, attn_out, a->att, H * D, C));
    model_share_end(m);
    if (sandwich) MODEL_TRY(model_norm_forward(m, a->x_mid, a->rstd_pa, a->o_raw, P + o->post_attn, T, C));
    MODEL_TRY(be->residual_forward(a->x_mid, a->x_mid, a->x_in, (int64_t)T * C));
    MODEL_TRY(model_norm_forward(m, a->ln2, a->rstd2, a->x_mid, P + o->ln2, T, C));
    MODEL_TRY(model_act16_keep(m, MODEL_ACT16_LN2, a->ln2, (int64_t)T * C)); /* gate, up and their dW */
    if (o->router >= 0) { /* a mixture-of-experts layer (no recompute shortcut: it keeps its own) */
        MODEL_TRY(model_moe_forward(m, l, a->ln2, next));
        return next ? be->residual_forward(next, next, a->x_mid, (int64_t)T * C) : CTRL_OK;
    }
    if (next || !model_keeps_mlp(m, l)) {      /* a recompute keeping them skips gate/up (selective) */
        model_share(m, 0, 0, a->ln2, T, C, 2); /* gate, up and their adapters */
        MODEL_TRY(model_linear_forward(m, a->g, a->ln2, P + o->wg, NULL, T, C, I));
        MODEL_TRY(lora_forward(m, l, LORA_GATE, a, a->g, a->ln2, C, I));
        MODEL_TRY(model_linear_forward(m, a->u, a->ln2, P + o->wu, NULL, T, C, I));
        MODEL_TRY(lora_forward(m, l, LORA_UP, a, a->u, a->ln2, C, I));
        model_share_end(m);
    }
    MODEL_TRY(model_act_forward(m, a->h, a->g, a->u, (int64_t)T * I));
    MODEL_TRY(model_act16_keep(m, MODEL_ACT16_H, a->h, (int64_t)T * I)); /* down and its dW */
    /* a recompute (next NULL) stops here, keeping the down adapter's input; with sandwich norms it
     * also needs down_proj's output, which post_feedforward_layernorm's backward reads */
    if (!next && !sandwich) return lora_forward(m, l, LORA_DOWN, a, NULL, a->h, I, C);
    float *mlp_out = sandwich ? a->d_raw : next;
    model_share(m, 0, 0, a->h, T, I, 1 + lora_reads(m, l, LORA_DOWN, 1));
    MODEL_TRY(model_linear_forward(m, mlp_out, a->h, P + o->wd, NULL, T, I, C));
    MODEL_TRY(lora_forward(m, l, LORA_DOWN, a, mlp_out, a->h, I, C));
    model_share_end(m);
    if (!next) return CTRL_OK;
    if (sandwich) MODEL_TRY(model_norm_forward(m, next, a->rstd_pf, a->d_raw, P + o->post_ffw, T, C));
    return be->residual_forward(next, next, a->x_mid, (int64_t)T * C);
}

ctrl_status model_layer_forward(ctrl_model *m, int l, float *next, model_attention_fn attend, void *ctx) {
    ctrl_status st = layer_forward(m, l, next, attend, ctx);
    model_share_end(m); /* on every return: no operand stays shared past the layer */
    return st;
}

/* Keeps the batch (backward needs it after the caller's buffers may have changed) on the host and
 * on the backend: tokens, positions, targets, cu_seqlens in one buffer each side, and after them the
 * tokens the embedding's backward scatters (m->grad_tokens: the padding_idx, config.json's
 * pad_token_id, as -1: nn.Embedding gives its row no gradient). */
static ctrl_status keep_batch(ctrl_model *m, const ctrl_batch *b) {
    const int tt = m->has_lora && m->tt[0].n; /* and the tokens as rows of trainable_token_indices' tensor */
    const size_t n = (size_t)((4 + tt) * b->T + b->B + 1);
    free(m->batch_mem);
    if (!(m->batch_mem = malloc(sizeof(int32_t) * n)))
        return ctrl_error_set(CTRL_ERR_NOMEM, "model: a batch of %d tokens", b->T);
    int32_t *bm = m->batch_mem;
    memcpy(bm, b->tokens, 4 * (size_t)b->T), memcpy(bm + b->T, b->positions, 4 * (size_t)b->T);
    memcpy(bm + 2 * b->T, b->targets, 4 * (size_t)b->T),
        memcpy(bm + 3 * b->T, b->cu_seqlens, 4 * (size_t)(b->B + 1));
    int32_t *gt = bm + 3 * b->T + b->B + 1;
    for (int t = 0; t < b->T; t++) gt[t] = b->tokens[t] == m->embed_pad ? -1 : b->tokens[t];
    if (tt) lora_tokens_batch(m, b->tokens, b->T, gt + b->T);
    if (!m->be->host_memory) {
        MODEL_TRY(model_grow(m, (void **)&m->dbatch_mem, &m->dbatch_bytes, sizeof(int32_t) * n));
        MODEL_TRY(m->be->to_device(m->dbatch_mem, bm, sizeof(int32_t) * n));
    }
    for (int side = 0; side < 2; side++) {
        const int32_t *p = side == 0 || m->be->host_memory ? bm : m->dbatch_mem;
        (side == 0 ? &m->batch : &m->dev_batch)[0] = (ctrl_batch){.T = b->T,
                                                                  .B = b->B,
                                                                  .tokens = p,
                                                                  .positions = p + b->T,
                                                                  .targets = p + 2 * b->T,
                                                                  .cu_seqlens = p + 3 * b->T};
        if (side == 1) m->grad_tokens = p + 3 * b->T + b->B + 1;
        if (side == 1) m->tt_tokens = tt ? m->grad_tokens + b->T : NULL;
    }
    return CTRL_OK;
}

/* The forward; with dlogp (a fused forward) the head's backward too: its parameter gradient
 * accumulated, dL/d(final norm output) kept in head_dh for ctrl_model_backward(m, NULL). Per-token
 * inputs and outputs are the caller's host buffers: with host memory the ops use them as they are,
 * a device stages them (model_stage). */
ctrl_status model_trunk_forward(ctrl_model *m, const ctrl_batch *b) {
    const ctrl_backend_ops *be = m->be;
    const ctrl_model_config *c = &m->cfg;
    if (!m->attn)
        return ctrl_error_set(CTRL_ERR_RUNTIME, "model: no attention plugin to run the forward with");
    if (c->attn_softcap > 0 && !ctrl_attention_has(m->attn, CTRL_ATTENTION_SOFTCAP))
        return ctrl_error_set(CTRL_ERR_PLUGIN,
                              "model: %s needs attention logit soft-capping (attn_logit_softcapping = %g), "
                              "which this attention plugin does not declare (eager and flash do)",
                              c->model_type, (double)c->attn_softcap);
    MODEL_TRY(model_check_backend(m, be));
    m->head_dh_ready = 0; /* a backward(NULL) needs this forward's */
    m->moe_aux_armed = 0; /* an auxiliary loss is armed after the forward it belongs to */
    MODEL_TRY(check_batch(m, b));
    /* products in plain fp32 (the bf16 fallback): no rounded copy of the weights, whatever T (INT_MAX:
     * model_prepare_weights' per-call rounding, which these products skip) */
    MODEL_TRY(model_prepare_weights(m, model_bf16_as_fp32(m) ? INT_MAX : b->T));
    int max_pos = 0;
    for (int i = 0; i < b->T; i++) max_pos = b->positions[i] > max_pos ? b->positions[i] : max_pos;
    MODEL_TRY(model_ensure_rope(m, max_pos + 1));
    MODEL_TRY(model_ensure_acts(m, b->T));
    MODEL_TRY(model_moe_ensure(m, b->T));
    MODEL_TRY(keep_batch(m, b));
    m->T = b->T;
    m->lora_step += m->training; /* a fresh dropout mask per training forward (a recompute reuses it) */
    const int T = b->T, C = c->hidden_size;
    const float *P = m->dparams;
    MODEL_TRY(model_offload_begin(m));        /* before the slots are written */
    MODEL_TRY(model_outer_hooks(m, 0, 0, 1)); /* ZeRO-3: the embeddings gathered for the lookup */
    MODEL_TRY(model_embed_lookup(m, m->acts[0].x_in, m->dev_batch.tokens, T, C)); /* fp32, or bf16 rows */
    if (c->embed_scale > 0) MODEL_TRY(be->scale(m->acts[0].x_in, c->embed_scale, (int64_t)T * C));
    MODEL_TRY(model_outer_hooks(m, 0, 0, 0)); /* and released */
    for (int l = 0; l < c->n_layers; l++) {
        MODEL_TRY(model_layer_hooks(m, l, 0, 1));
        MODEL_TRY(model_offload_input(m, l, 1)); /* out while the layer reads it */
        MODEL_TRY(model_layer_forward(m, l, l + 1 < c->n_layers ? m->acts[l + 1].x_in : m->x_out,
                                      model_plugin_attention, NULL));
        MODEL_TRY(model_layer_hooks(m, l, 0, 0));
    }
    return model_norm_forward(m, m->lnf, m->rstdf, m->x_out, P + m->off_norm, T, C);
}

static ctrl_status forward(ctrl_model *m, const ctrl_batch *b, const float *dlogp, float *logp,
                           float *entropy, int32_t *correct) {
    const ctrl_backend_ops *be = m->be;
    if (m->off_lm_head < 0)
        return ctrl_error_set(CTRL_ERR_RUNTIME,
                              "model: a sequence classifier (%d labels) has no LM head to give log-probs "
                              "(its scores come from ctrl_model_score_forward)",
                              m->cfg.num_labels);
    MODEL_TRY(model_trunk_forward(m, b));
    const int T = b->T, C = m->cfg.hidden_size;
    ctrl_head_args ha = model_head_args(m);
    const int fused = dlogp != NULL && ctrl_backend_has(be, head_forward_backward);
    MODEL_TRY(model_grow(m, &m->head_ws, &m->head_ws_bytes,
                         fused ? be->head_fused_workspace_bytes(&ha) : be->head_workspace_bytes(&ha)));
    if (dlogp)
        MODEL_TRY(model_grow(m, (void **)&m->head_dh, &m->head_dh_bytes, sizeof(float) * (size_t)T * C));
    model_stage st;
    MODEL_TRY(model_stage_in(m, &st, dlogp, logp, correct));
    /* ZeRO-3: the head gathered (with dlogp, one gather for its forward and backward), released after */
    MODEL_TRY(model_outer_hooks(m, 1, dlogp != NULL, 1));
    ha = model_head_args(m); /* (its weights' bf16 values are known once gathered) */
    /* a trained head's bf16 panels: their pages kept from step to step */
    if (be->host_memory) ha.w_keep = &m->head_keep;
    if (fused)
        MODEL_TRY(be->head_forward_backward(&ha, st.dlogp, st.logp, m->head_ent, m->head_lse, st.correct,
                                            m->head_dh, model_grad(m, m->off_lm_head), m->head_ws));
    else {
        MODEL_TRY(be->head_forward(&ha, st.logp, m->head_ent, m->head_lse, st.correct, m->head_ws));
        if (dlogp) /* a backend without the one-pass head: its backward right after */
            MODEL_TRY(be->head_backward(&ha, m->head_lse, st.dlogp, NULL, NULL, m->head_dh,
                                        model_grad(m, m->off_lm_head), m->head_ws));
    }
    MODEL_TRY(model_outer_hooks(m, 1, 0, 0));
    MODEL_TRY(model_stage_out(m, &st, logp, correct));
    m->head_dh_ready = dlogp != NULL;
    return entropy ? be->to_host(entropy, m->head_ent, sizeof(float) * (size_t)T) : CTRL_OK;
}

ctrl_status ctrl_model_forward(ctrl_model *m, const ctrl_batch *b, float *logp, float *entropy,
                               int32_t *correct) {
    return forward(m, b, NULL, logp, entropy, correct);
}

ctrl_status ctrl_model_forward_fused(ctrl_model *m, const ctrl_batch *b, const float *dlogp, float *logp,
                                     float *entropy, int32_t *correct) {
    if (!dlogp) return ctrl_error_set(CTRL_ERR_RUNTIME, "model: a fused forward needs dL/dlogp");
    return forward(m, b, dlogp, logp, entropy, correct);
}
