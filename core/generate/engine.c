/* The generation engine (see engine.h): life cycle, sleep, and the one-call generate over the
 * scheduler of engine_schedule.c. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config/config_load.h"
#include "device/backend.h"
#include "generate/engine_internal.h"

/* The pool on the model's backend: in device memory for a model on a device. */
static ctrl_status make_pool(ctrl_engine *e) {
    const ctrl_model_config *c = ctrl_model_cfg(e->model);
    const int bf16 = e->cfg.kv_cache_dtype < 0 ? ctrl_model_compute_dtype(e->model) == CTRL_BF16
                                               : e->cfg.kv_cache_dtype == 1;
    return ctrl_kv_cache_create_on(ctrl_model_backend(e->model), c->n_layers, c->n_kv_heads, c->head_dim,
                                   e->cfg.block_size, e->cfg.kv_cache_bytes, bf16 ? CTRL_BF16 : CTRL_F32,
                                   &e->kv);
}

ctrl_status ctrl_engine_create(ctrl_model *m, const ctrl_engine_config *cfg, ctrl_engine **out) {
    if (cfg->block_size < 1 || cfg->max_num_seqs < 1 || cfg->max_num_batched_tokens < 1)
        return ctrl_error_set(CTRL_ERR_CONFIG,
                              "generation: block_size, max_num_seqs and max_num_batched_tokens must "
                              "be positive");
    if (cfg->decode_threads < 0)
        return ctrl_error_set(CTRL_ERR_CONFIG, "generation: decode_threads %d (0 = auto, or a thread count)",
                              cfg->decode_threads);
    if (!ctrl_model_paged_attention(m))
        return ctrl_error_set(CTRL_ERR_PLUGIN,
                              "generation: the model has no paged attention plugin to decode with");
    ctrl_engine *e = calloc(1, sizeof *e);
    if (!e) return ctrl_error_set(CTRL_ERR_NOMEM, "generation: out of memory");
    e->model = m, e->cfg = *cfg;
    if (cfg->prefix_cache) e->prefix = ctrl_prefix_cache_create();
    ctrl_status st = make_pool(e);
    if (st != CTRL_OK) {
        free(e);
        return st;
    }
    *out = e;
    return CTRL_OK;
}

ctrl_status ctrl_engine_attach_attention(ctrl_model *m, const ctrl_plugin *paged) {
    if (!paged)
        return ctrl_error_set(CTRL_ERR_PLUGIN,
                              "generation: attention plugin 'paged' is not loaded (see --plugin-dir)");
    return ctrl_model_set_paged_attention(m, paged->ops);
}

void ctrl_engine_config_from(const ctrl_config *cfg, ctrl_engine_config *out) {
    const ctrl_run_settings *s = ctrl_config_settings(cfg);
    size_t bytes = (size_t)s->generation.kv_cache_bytes;
    if (bytes == 0) /* the CPU's share: gpu_memory_utilization of physical memory */
        bytes = (size_t)(s->generation.gpu_memory_utilization * (double)sysconf(_SC_PHYS_PAGES) *
                         (double)sysconf(_SC_PAGESIZE));
    *out = (ctrl_engine_config){.kv_cache_bytes = bytes,
                                .kv_cache_dtype = s->generation.kv_cache_dtype,
                                .block_size = s->generation.block_size,
                                .max_num_seqs = s->generation.max_num_seqs,
                                .max_num_batched_tokens = s->generation.max_num_batched_tokens,
                                .decode_threads = s->generation.decode_threads};
}

ctrl_status ctrl_engine_config_for(const ctrl_config *cfg, const ctrl_model *m, ctrl_engine_config *out) {
    ctrl_engine_config_from(cfg, out);
    const ctrl_run_settings *s = ctrl_config_settings(cfg);
    const ctrl_backend_ops *be = ctrl_model_backend(m);
    if (be->host_memory || s->generation.kv_cache_bytes != 0) return CTRL_OK;
    size_t free_b = 0, total = 0; /* the device's share, not the host's */
    ctrl_status st =
        ctrl_backend_has(be, memory_info)
            ? be->memory_info(&free_b, &total)
            : ctrl_error_set(CTRL_ERR_UNSUPPORTED, "the %s backend cannot say its memory", be->name);
    if (st != CTRL_OK)
        return ctrl_error_wrap(st,
                               "[generation] gpu_memory_utilization: sizing the KV cache on %s (set "
                               "[generation] kv_cache_bytes instead)",
                               be->name);
    out->kv_cache_bytes = (size_t)(s->generation.gpu_memory_utilization * (double)total);
    if (out->kv_cache_bytes > free_b / 2) out->kv_cache_bytes = free_b / 2;
    return CTRL_OK;
}

ctrl_status ctrl_engine_sleep(ctrl_engine *e, int level) {
    if (level < 1 || level > 2)
        return ctrl_error_set(CTRL_ERR_CONFIG, "generation: sleep level %d (1 or 2)", level);
    if (e->n > 0) return ctrl_error_set(CTRL_ERR_RUNTIME, "generation: cannot sleep while requests run");
    if (e->prefix) ctrl_prefix_cache_reset(e->prefix, e->kv); /* its blocks go with the pool */
    ctrl_kv_cache_free(e->kv);
    e->kv = NULL, e->asleep = level;
    if (level ==
        2) { /* the step's scratch (logits of every running sequence) and the model's decode scratch */
        free(e->batch), free(e->n_new), free(e->tokens), free(e->kvs), free(e->logits), free(e->draws);
        e->batch = NULL, e->n_new = NULL, e->tokens = NULL, e->kvs = NULL, e->logits = NULL, e->draws = NULL;
        e->scratch = 0, e->draws_cap = 0;
        ctrl_model_release_decode_scratch(e->model);
    }
    const ctrl_backend_ops *be = ctrl_model_backend(e->model);
    if (ctrl_backend_has(be, release_cached)) be->release_cached(); /* to the driver, not the cache */
    return CTRL_OK;
}

ctrl_status ctrl_engine_wake_up(ctrl_engine *e) {
    if (!e->asleep) return CTRL_OK;
    ctrl_status st = make_pool(e);
    if (st == CTRL_OK) e->asleep = 0;
    return st;
}

void ctrl_engine_free(ctrl_engine *e) {
    if (!e) return;
    ctrl_engine_abort(e);
    free(e->seqs), free(e->batch), free(e->n_new), free(e->tokens), free(e->kvs), free(e->logits),
        free(e->draws);
    ctrl_prefix_cache_free(e->prefix, e->kv);
    ctrl_kv_cache_free(e->kv);
    free(e);
}

void ctrl_engine_reset_prefix_cache(ctrl_engine *e) {
    if (e->prefix) ctrl_prefix_cache_reset(e->prefix, e->kv);
}

long ctrl_engine_prefix_hits(const ctrl_engine *e) { return ctrl_prefix_cache_hits(e->prefix); }

void ctrl_engine_stats(const ctrl_engine *e, long *steps, long *preemptions, long *shared_blocks) {
    if (steps) *steps = e->steps;
    if (preemptions) *preemptions = e->preemptions;
    if (shared_blocks) *shared_blocks = e->shared_blocks;
}

long ctrl_engine_joined(const ctrl_engine *e) { return e->joined; }

void ctrl_gen_output_free(ctrl_gen_output *o) {
    free(o->ids), free(o->logprobs), free(o->top_ids), free(o->top_logprobs);
    memset(o, 0, sizeof *o);
}

ctrl_status ctrl_engine_generate(ctrl_engine *e, const ctrl_gen_request *reqs, int n_req,
                                 ctrl_gen_output *outs, void (*progress)(long generated, void *ctx),
                                 void *ctx) {
    if (e->n > 0)
        return ctrl_error_set(CTRL_ERR_RUNTIME, "generation: the engine is running requests added to it");
    ctrl_status st = CTRL_OK;
    int n_out = 0;
    for (int r = 0; r < n_req && st == CTRL_OK; r++) {
        st = ctrl_engine_add(e, &reqs[r], outs + n_out);
        if (st != CTRL_OK)
            ctrl_error_wrap(st, "request %d", r);
        else
            n_out += reqs[r].n;
    }
    const long generated = e->generated;
    for (int active = 1; st == CTRL_OK && active;) {
        st = ctrl_engine_step(e, &active);
        if (progress && st == CTRL_OK) progress(e->generated - generated, ctx);
    }
    ctrl_engine_abort(e); /* what is left: nothing, or an error's unfinished requests */
    if (st != CTRL_OK)
        for (int i = 0; i < n_out; i++) ctrl_gen_output_free(&outs[i]);
    return st;
}
