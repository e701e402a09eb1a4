/* The generation engine's scheduler (see engine.h). */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "generate/engine.h"
#include "generate/prefix_cache.h"

enum { WAITING, RUNNING, FORK_PENDING, FINISHED };

typedef struct gen_seq {
    int req, state, forked;
    ctrl_kv_seq kv;
    int32_t *tokens; /* prompt + generated: what a recompute after preemption prefills */
    int n_tokens, cap;
    ctrl_rng rng;
    ctrl_gen_output *out;
} gen_seq;

struct ctrl_engine {
    ctrl_model *model;
    ctrl_engine_config cfg;
    ctrl_kv_cache *kv;         /* NULL while asleep */
    ctrl_prefix_cache *prefix; /* NULL unless cfg.prefix_cache */
    int asleep;
    long steps, preemptions, shared_blocks;
};

static ctrl_status make_pool(ctrl_engine *e) {
    const ctrl_model_config *c = ctrl_model_cfg(e->model);
    return ctrl_kv_cache_create(c->n_layers, c->n_kv_heads, c->head_dim, e->cfg.block_size,
                                e->cfg.kv_cache_bytes, &e->kv);
}

ctrl_status ctrl_engine_create(ctrl_model *m, const ctrl_engine_config *cfg, ctrl_engine **out) {
    if (cfg->block_size < 1 || cfg->max_num_seqs < 1 || cfg->max_num_batched_tokens < 1)
        return ctrl_error_set(CTRL_ERR_CONFIG,
                              "generation: block_size, max_num_seqs and max_num_batched_tokens must "
                              "be positive");
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

ctrl_status ctrl_engine_attach_attention(ctrl_model *m, const ctrl_registry *reg, const char *name) {
    if (!name) name = "paged";
    const ctrl_plugin_entry *e = ctrl_registry_find(reg, CTRL_KIND_ATTENTION, name);
    if (!e)
        return ctrl_error_set(CTRL_ERR_PLUGIN,
                              "generation: attention plugin '%s' is not loaded (see --plugin-dir)", name);
    return ctrl_model_set_paged_attention(m, e->plugin->ops);
}

void ctrl_engine_config_from(const ctrl_config *cfg, ctrl_engine_config *out) {
    long bytes = ctrl_config_get_int(cfg, "generation", "kv_cache_bytes", 0);
    if (bytes <= 0) { /* the CPU's share: gpu_memory_utilization of physical memory */
        const double frac = ctrl_config_get_float(cfg, "generation", "gpu_memory_utilization", 0.3);
        bytes = (long)(frac * (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE));
    }
    *out =
        (ctrl_engine_config){.kv_cache_bytes = (size_t)bytes,
                             .block_size = (int)ctrl_config_get_int(cfg, "generation", "block_size", 16),
                             .max_num_seqs = (int)ctrl_config_get_int(cfg, "generation", "max_num_seqs", 256),
                             .max_num_batched_tokens =
                                 (int)ctrl_config_get_int(cfg, "generation", "max_num_batched_tokens", 8192)};
}

ctrl_status ctrl_engine_sleep(ctrl_engine *e, int level) {
    if (level < 1 || level > 2)
        return ctrl_error_set(CTRL_ERR_CONFIG, "generation: sleep level %d (1 or 2)", level);
    if (e->prefix) ctrl_prefix_cache_reset(e->prefix, e->kv); /* its blocks go with the pool */
    ctrl_kv_cache_free(e->kv);
    e->kv = NULL, e->asleep = level;
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

void ctrl_gen_output_free(ctrl_gen_output *o) {
    free(o->ids), free(o->logprobs);
    memset(o, 0, sizeof *o);
}

static int push_token(gen_seq *s, int32_t t) {
    if (s->n_tokens == s->cap) {
        int32_t *p = realloc(s->tokens, sizeof(int32_t) * (size_t)(s->cap = s->cap * 2 + 16));
        if (!p) return -1;
        s->tokens = p;
    }
    s->tokens[s->n_tokens++] = t;
    return 0;
}

/* Draws the next token from the logits after the sequence's last token, records it, and decides
 * whether the sequence is finished. */
static ctrl_status sample_next(ctrl_engine *e, gen_seq *s, const ctrl_gen_request *r, const float *logits) {
    const int V = ctrl_model_cfg(e->model)->vocab_size;
    float *l = malloc(sizeof(float) * (size_t)V), lp;
    if (!l) return ctrl_error_set(CTRL_ERR_NOMEM, "generation: out of memory");
    memcpy(l, logits, sizeof(float) * (size_t)V);
    int32_t t = ctrl_sample(&r->sampling, l, V, s->tokens, s->n_tokens, &s->rng, &lp);
    free(l);
    if (t < 0) return ctrl_error_set(CTRL_ERR_CONFIG, "generation: invalid sampling parameters");
    ctrl_gen_output *o = s->out;
    o->ids = realloc(o->ids, sizeof(int32_t) * (size_t)(o->len + 1));
    o->logprobs = realloc(o->logprobs, sizeof(float) * (size_t)(o->len + 1));
    if (!o->ids || !o->logprobs || push_token(s, t) != 0)
        return ctrl_error_set(CTRL_ERR_NOMEM, "generation: out of memory");
    o->ids[o->len] = t, o->logprobs[o->len] = lp, o->len++;
    for (int i = 0; i < r->n_stop; i++) o->stopped |= t == r->stop_ids[i];
    if (!o->stopped && r->stop_check) o->stopped = r->stop_check(r->stop_ctx, o->ids, o->len) != 0;
    if (o->stopped || o->len >= r->max_tokens) {
        s->state = FINISHED;
        ctrl_kv_seq_release(e->kv, &s->kv);
    }
    return CTRL_OK;
}

/* Frees blocks by preempting the newest running sequence other than those in [keep, keep + n_keep);
 * it will prefill its prompt and completion again. Returns 0 when there is none. */
static int preempt(ctrl_engine *e, gen_seq *seqs, int n, gen_seq *const *keep, int n_keep) {
    for (int i = n - 1; i >= 0; i--) {
        if (seqs[i].state != RUNNING) continue;
        int kept = 0;
        for (int k = 0; k < n_keep; k++) kept |= keep[k] == &seqs[i];
        if (kept) continue;
        ctrl_kv_seq_release(e->kv, &seqs[i].kv);
        seqs[i].state = WAITING;
        e->preemptions++;
        return 1;
    }
    return 0;
}

ctrl_status ctrl_engine_generate(ctrl_engine *e, const ctrl_gen_request *reqs, int n_req,
                                 ctrl_gen_output *outs, void (*progress)(long generated, void *ctx),
                                 void *ctx) {
    if (e->asleep)
        return ctrl_error_set(CTRL_ERR_RUNTIME, "generation: the engine is asleep (wake_up first)");
    int n = 0;
    for (int r = 0; r < n_req; r++) {
        if (reqs[r].n < 1 || reqs[r].prompt_len < 1 || reqs[r].max_tokens < 1)
            return ctrl_error_set(CTRL_ERR_CONFIG,
                                  "generation: request %d needs a prompt, n >= 1 and max_tokens >= 1", r);
        n += reqs[r].n;
    }
    const int V = ctrl_model_cfg(e->model)->vocab_size;
    gen_seq *seqs = calloc((size_t)n, sizeof *seqs);
    gen_seq **batch = malloc(sizeof(gen_seq *) * (size_t)n);
    int *n_new = malloc(sizeof(int) * (size_t)n);
    int32_t *tokens = malloc(sizeof(int32_t) * (size_t)e->cfg.max_num_batched_tokens);
    ctrl_kv_seq **kvs = malloc(sizeof(ctrl_kv_seq *) * (size_t)n);
    float *logits = malloc(sizeof(float) * (size_t)n * V);
    ctrl_status st = seqs && batch && n_new && tokens && kvs && logits
                         ? CTRL_OK
                         : ctrl_error_set(CTRL_ERR_NOMEM, "generation: out of memory");
    for (int r = 0, i = 0; r < n_req && st == CTRL_OK; r++)
        for (int k = 0; k < reqs[r].n; k++, i++) {
            gen_seq *s = &seqs[i];
            s->req = r, s->out = &outs[i],
            s->state = k == 0 || e->cfg.no_prefix_sharing ? WAITING : FORK_PENDING;
            s->forked = k > 0 && e->cfg.no_prefix_sharing;
            if (k == 0 && e->prefix)
                ctrl_prefix_cache_attach(e->prefix, e->kv, reqs[r].prompt, reqs[r].prompt_len, &s->kv);
            memset(s->out, 0, sizeof *s->out);
            ctrl_rng_seed(&s->rng, reqs[r].seed * 1000003ull + (uint64_t)k); /* per request and sample */
            for (int t = 0; t < reqs[r].prompt_len && st == CTRL_OK; t++)
                if (push_token(s, reqs[r].prompt[t]) != 0)
                    st = ctrl_error_set(CTRL_ERR_NOMEM, "generation: prompt");
        }
    long generated = 0;
    for (;;) {
        if (st != CTRL_OK) break;
        /* 1. decode every running sequence (one token each), 2. prefill chunks of waiting ones */
        int nb = 0, budget = e->cfg.max_num_batched_tokens, t = 0;
        for (int i = 0; i < n && nb < e->cfg.max_num_seqs && budget > 0; i++)
            if (seqs[i].state == RUNNING) batch[nb] = &seqs[i], n_new[nb++] = 1, budget--;
        for (int i = 0; i < n && nb < e->cfg.max_num_seqs && budget > 0; i++)
            if (seqs[i].state == WAITING) {
                const int left = seqs[i].n_tokens - seqs[i].kv.len;
                batch[nb] = &seqs[i], n_new[nb] = left < budget ? left : budget, budget -= n_new[nb++];
            }
        if (nb == 0) break; /* everything finished */
        /* blocks for the chosen tokens, preempting when the pool is out: first a running sequence
         * outside this step, else the newest one scheduled in it (possibly this one: it waits) */
        for (int b = 0; b < nb && st == CTRL_OK; b++) {
            while (ctrl_kv_seq_reserve(e->kv, &batch[b]->kv, batch[b]->kv.len + n_new[b]) != CTRL_OK) {
                const int need = (batch[b]->kv.len + n_new[b] + e->kv->block_size - 1) / e->kv->block_size -
                                 batch[b]->kv.n_blocks;
                if (e->prefix && ctrl_prefix_cache_evict(e->prefix, e->kv, need) > 0) continue;
                if (preempt(e, seqs, n, batch, nb)) continue;
                if (nb > 1) {
                    gen_seq *victim = batch[--nb];
                    ctrl_kv_seq_release(e->kv, &victim->kv);
                    if (victim->state == RUNNING) e->preemptions++;
                    victim->state = WAITING;
                    if (nb == b) break; /* it was this one */
                    continue;
                }
                st = ctrl_error_set(
                    CTRL_ERR_NOMEM,
                    "generation: the KV cache (%d blocks of %d tokens) cannot hold one sequence of "
                    "%d tokens; raise kv_cache_bytes",
                    e->kv->n_blocks, e->kv->block_size, batch[b]->kv.len + n_new[b]);
                break;
            }
        }
        if (st != CTRL_OK) break;
        for (int b = 0; b < nb; b++) {
            memcpy(tokens + t, batch[b]->tokens + batch[b]->kv.len, sizeof(int32_t) * (size_t)n_new[b]);
            t += n_new[b];
            kvs[b] = &batch[b]->kv;
        }
        st = ctrl_model_decode(e->model, e->kv, kvs, tokens, n_new, nb, logits);
        e->steps++;
        for (int b = 0; b < nb && st == CTRL_OK; b++) {
            gen_seq *s = batch[b];
            if (s->kv.len < s->n_tokens) continue; /* prefill not done yet */
            const ctrl_gen_request *r = &reqs[s->req];
            s->state = RUNNING;
            if (!s->forked) { /* the first time the prompt is cached: the other samples share it */
                s->forked = 1;
                if (e->prefix) ctrl_prefix_cache_insert(e->prefix, e->kv, r->prompt, r->prompt_len, &s->kv);
                for (int i = 0; i < n && st == CTRL_OK; i++) {
                    if (seqs[i].req != s->req || seqs[i].state != FORK_PENDING) continue;
                    int shared = 0;
                    st = ctrl_kv_seq_fork(e->kv, &s->kv, &seqs[i].kv, &shared);
                    if (st != CTRL_OK) break; /* no block to fork into: it prefills on its own */
                    e->shared_blocks += shared;
                    seqs[i].forked = 1, seqs[i].state = RUNNING;
                    st = sample_next(e, &seqs[i], r, logits + (size_t)b * V);
                    generated++;
                }
                if (st == CTRL_ERR_NOMEM) { /* leave the others to prefill themselves */
                    st = CTRL_OK;
                    for (int i = 0; i < n; i++)
                        if (seqs[i].req == s->req && seqs[i].state == FORK_PENDING)
                            seqs[i].state = WAITING, seqs[i].forked = 1;
                }
            }
            if (st == CTRL_OK) st = sample_next(e, s, r, logits + (size_t)b * V), generated++;
        }
        if (progress) progress(generated, ctx);
    }
    for (int i = 0; seqs && i < n; i++) {
        ctrl_kv_seq_release(e->kv, &seqs[i].kv);
        free(seqs[i].tokens);
        if (st != CTRL_OK) ctrl_gen_output_free(&outs[i]);
    }
    free(seqs), free(batch), free(n_new), free(tokens), free(kvs), free(logits);
    return st;
}
