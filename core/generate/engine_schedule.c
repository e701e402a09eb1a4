/* The engine's scheduler (see engine.h): requests become sequences (n samples each); every step
 * decodes the running sequences and fills the rest of the token budget with prefill chunks of
 * waiting ones, preempting the newest running sequence when blocks run out. Requests may be added
 * between steps: they join the running generation. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "generate/engine_internal.h"

static int push_token(gen_seq *s, int32_t t) {
    if (s->n_tokens == s->cap) {
        int32_t *p = realloc(s->tokens, sizeof(int32_t) * (size_t)(s->cap = s->cap * 2 + 16));
        if (!p) return -1;
        s->tokens = p;
    }
    s->tokens[s->n_tokens++] = t;
    return 0;
}

/* Drops a sequence (its blocks released if it still holds any), and its request with the last. */
static void drop(ctrl_engine *e, gen_seq *s) {
    ctrl_kv_seq_release(e->kv, &s->kv);
    free(s->tokens);
    if (--s->rq->refs == 0) free(s->rq);
}

/* The sampler's own rule (ctrl_sampling_params_valid) applied to one field at a time, the others
 * neutral, so that the message names the field at fault. */
static const char *bad_sampling_field(const ctrl_sampling_params *p) {
    const ctrl_sampling_params neutral = {.temperature = 1, .top_p = 1, .min_p = 0, .repetition_penalty = 1};
    ctrl_sampling_params t = neutral, tp = neutral, mp = neutral, rp = neutral, pp = neutral, fp = neutral;
    t.temperature = p->temperature, tp.top_p = p->top_p, mp.min_p = p->min_p;
    rp.repetition_penalty = p->repetition_penalty;
    pp.presence_penalty = p->presence_penalty, fp.frequency_penalty = p->frequency_penalty;
    return !ctrl_sampling_params_valid(&t)    ? "temperature (0, or a positive normal float)"
           : !ctrl_sampling_params_valid(&tp) ? "top_p (in (0, 1])"
           : !ctrl_sampling_params_valid(&mp) ? "min_p (in [0, 1])"
           : !ctrl_sampling_params_valid(&rp) ? "repetition_penalty (a positive normal float)"
           : !ctrl_sampling_params_valid(&pp) ? "presence_penalty (in [-2, 2])"
           : !ctrl_sampling_params_valid(&fp) ? "frequency_penalty (in [-2, 2])"
                                              : NULL;
}

ctrl_status ctrl_gen_request_check(const ctrl_gen_request *r) {
    if (r->n < 1 || r->prompt_len < 1 || r->max_tokens < 1 || r->top_logprobs < 0 || r->min_tokens < 0 ||
        r->n_bias < 0)
        return ctrl_error_set(
            CTRL_ERR_CONFIG,
            "generation: a request needs a prompt, n >= 1, max_tokens >= 1 and top_logprobs >= 0");
    const char *field = bad_sampling_field(&r->sampling);
    if (field) return ctrl_error_set(CTRL_ERR_CONFIG, "generation: invalid sampling parameter %s", field);
    return CTRL_OK;
}

ctrl_status ctrl_engine_add(ctrl_engine *e, const ctrl_gen_request *r, ctrl_gen_output *outs) {
    if (e->asleep)
        return ctrl_error_set(CTRL_ERR_RUNTIME, "generation: the engine is asleep (wake_up first)");
    ctrl_status st = ctrl_gen_request_check(r); /* a bad request is refused here, alone */
    if (st != CTRL_OK) return st;
    if (r->adapter < 0 || r->adapter > ctrl_model_adapter_count(e->model))
        return ctrl_error_set(CTRL_ERR_CONFIG, "generation: no LoRA adapter %d (the model has %d)",
                              r->adapter, ctrl_model_adapter_count(e->model));
    if (e->n + r->n > e->cap) {
        int cap = e->cap ? e->cap : 64;
        while (cap < e->n + r->n) cap *= 2;
        gen_seq *p = realloc(e->seqs, sizeof *p * (size_t)cap);
        if (!p) return ctrl_error_set(CTRL_ERR_NOMEM, "generation: out of memory");
        e->seqs = p, e->cap = cap;
    }
    gen_req *rq = calloc(1, sizeof *rq);
    if (!rq) return ctrl_error_set(CTRL_ERR_NOMEM, "generation: out of memory");
    rq->r = *r, rq->outs = outs, rq->left = r->n;
    const int first = e->n;
    for (int k = 0; k < r->n; k++) {
        gen_seq *s = &e->seqs[e->n++];
        memset(s, 0, sizeof *s);
        s->rq = rq, s->out = &outs[k], rq->refs++;
        s->state = k == 0 || e->cfg.no_prefix_sharing ? WAITING : FORK_PENDING;
        s->forked = k > 0 && e->cfg.no_prefix_sharing;
        if (k == 0 && e->prefix && !r->adapter) /* cached K/V are the base's: not an adapter's */
            ctrl_prefix_cache_attach(e->prefix, e->kv, r->prompt, r->prompt_len, &s->kv);
        memset(s->out, 0, sizeof *s->out);
        ctrl_rng_seed(&s->rng, r->seed * 1000003ull + (uint64_t)k); /* per request and sample */
        for (int t = 0; t < r->prompt_len; t++)
            if (push_token(s, r->prompt[t]) != 0) { /* this request leaves again; the others stay */
                while (e->n > first) drop(e, &e->seqs[--e->n]);
                return ctrl_error_set(CTRL_ERR_NOMEM, "generation: prompt");
            }
    }
    if (first > 0 && e->stepped) e->joined++;
    return CTRL_OK;
}

void ctrl_engine_set_prefill_chunk(ctrl_engine *e, int tokens) { e->prefill_chunk = tokens > 0 ? tokens : 0; }

long ctrl_engine_capacity_tokens(const ctrl_engine *e) {
    return e->kv ? (long)e->kv->n_blocks * e->kv->block_size : 0;
}

void ctrl_engine_abort(ctrl_engine *e) {
    for (int i = 0; i < e->n; i++) {
        if (e->seqs[i].state != FINISHED) ctrl_gen_output_free(e->seqs[i].out);
        drop(e, &e->seqs[i]);
    }
    e->n = 0, e->stepped = 0;
}

void ctrl_engine_cancel(ctrl_engine *e, const ctrl_gen_output *outs) {
    /* matched by the request's outputs, not by its first sample's sequence: that one may have
     * finished and left while its siblings still run (they wrote into freed outputs after a cancel) */
    for (int i = 0; i < e->n; i++) {
        gen_seq *s = &e->seqs[i];
        gen_req *rq = s->rq;
        if (rq->outs != outs || s->state == FINISHED) continue;
        s->state = FINISHED; /* leaves at the next step */
        ctrl_kv_seq_release(e->kv, &s->kv);
        if (--rq->left == 0 && rq->r.on_finish) rq->r.on_finish(rq->r.finish_ctx);
    }
}

/* Records a drawn token and decides whether the sequence is finished (its request's on_finish runs
 * with the last sample). */
static ctrl_status record_token(ctrl_engine *e, gen_seq *s, const gen_draw *d) {
    const int32_t t = d->tok;
    const float lp = d->logprob;
    const ctrl_gen_request *r = &s->rq->r;
    if (t < 0)
        return t == -2 ? ctrl_error_set(CTRL_ERR_NOMEM, "generation: out of memory while sampling")
                       : ctrl_error_set(CTRL_ERR_CONFIG, "generation: invalid sampling parameters");
    ctrl_gen_output *o = s->out;
    const int k = r->top_logprobs;
    if (o->len >= s->out_cap || !o->ids) { /* the arrays grow by doubling: no allocation per token */
        const int cap = o->len >= s->out_cap ? 2 * o->len + 16 : s->out_cap;
        int32_t *ids = realloc(o->ids, sizeof(int32_t) * (size_t)cap);
        if (ids) o->ids = ids;
        float *lps = realloc(o->logprobs, sizeof(float) * (size_t)cap);
        if (lps) o->logprobs = lps;
        int32_t *ti =
            k > 0 && ids && lps ? realloc(o->top_ids, sizeof(int32_t) * (size_t)k * (size_t)cap) : NULL;
        if (ti) o->top_ids = ti;
        float *tl = ti ? realloc(o->top_logprobs, sizeof(float) * (size_t)k * (size_t)cap) : NULL;
        if (tl) o->top_logprobs = tl;
        if (!ids || !lps || (k > 0 && (!ti || !tl)))
            return ctrl_error_set(CTRL_ERR_NOMEM, "generation: out of memory");
        s->out_cap = cap;
    }
    if (push_token(s, t) != 0) return ctrl_error_set(CTRL_ERR_NOMEM, "generation: out of memory");
    if (k > 0) {
        memcpy(o->top_ids + (size_t)o->len * k, d->top_ids, sizeof(int32_t) * (size_t)k);
        memcpy(o->top_logprobs + (size_t)o->len * k, d->top_lps, sizeof(float) * (size_t)k);
        o->top_k = k;
    }
    o->ids[o->len] = t, o->logprobs[o->len] = lp, o->len++;
    e->generated++;
    for (int i = 0; i < r->n_stop && o->len > r->min_tokens - 1; i++) o->stopped |= t == r->stop_ids[i];
    if (!o->stopped && r->stop_check && o->len >= r->min_tokens)
        o->stopped = r->stop_check(r->stop_ctx, o->ids, o->len) != 0;
    if (o->stopped || o->len >= r->max_tokens) {
        s->state = FINISHED;
        ctrl_kv_seq_release(e->kv, &s->kv);
        if (--s->rq->left == 0 && r->on_finish) r->on_finish(r->finish_ctx);
    }
    return CTRL_OK;
}

/* Whether drawing changes nothing in the logits row (no bias, no stop ids masked, the processing of
 * ctrl_sampling_process_seq all off): the row is then read where it is, not copied first (several
 * samples may share a row). */
static int draws_in_place(const gen_draw *d, int V) {
    const ctrl_gen_request *r = &d->s->rq->r;
    const ctrl_sampling_params *p = &r->sampling;
    return r->n_bias == 0 && (r->n_stop == 0 || d->s->n_tokens - r->prompt_len >= r->min_tokens) &&
           p->repetition_penalty == 1.0f && p->presence_penalty == 0 && p->frequency_penalty == 0 &&
           (p->temperature == 0 || p->temperature == 1.0f) && (p->top_k <= 0 || p->top_k >= V) &&
           p->top_p >= 1.0f && p->min_p <= 0;
}

/* The step's draws: every sequence samples from its own logits row with its own generator, so they
 * run in parallel (a large vocabulary makes sampling a real share of a decode step); the tokens are
 * then recorded in order. */
static ctrl_status draw_all(ctrl_engine *e, int n) {
    const int V = ctrl_model_cfg(e->model)->vocab_size;
    size_t tops = 0; /* the step's top_logprobs scratch */
    for (int i = 0; i < n; i++) tops += (size_t)e->draws[i].s->rq->r.top_logprobs;
    int32_t *top_ids = tops ? malloc(sizeof(int32_t) * tops) : NULL;
    float *top_lps = tops ? malloc(sizeof(float) * tops) : NULL;
    if (tops && (!top_ids || !top_lps)) {
        free(top_ids), free(top_lps);
        return ctrl_error_set(CTRL_ERR_NOMEM, "generation: out of memory");
    }
    for (size_t i = 0, at = 0; i < (size_t)n; at += (size_t)e->draws[i++].s->rq->r.top_logprobs)
        e->draws[i].top_ids = tops ? top_ids + at : NULL, e->draws[i].top_lps = tops ? top_lps + at : NULL;
    if (engine_draws_on_device(e)) { /* the logits never left the device */
        ctrl_status st = engine_draw_device(e, e->draws, n);
        for (int i = 0; i < n && st == CTRL_OK; i++) st = record_token(e, e->draws[i].s, &e->draws[i]);
        free(top_ids), free(top_lps);
        return st;
    }
    int failed = 0;
#pragma omp parallel reduction(| : failed)
    {
        float *l = malloc(sizeof(float) * (size_t)V);
        failed = l == NULL;
#pragma omp for schedule(dynamic, 4)
        for (int i = 0; i < n; i++) {
            gen_draw *d = &e->draws[i];
            d->tok = -1;
            if (!l) continue;
            const ctrl_gen_request *r = &d->s->rq->r;
            float *row = l;
            if (draws_in_place(d, V)) { /* nothing written: the shared row itself (600 KB at 151k) */
                row = (float *)d->logits;
            } else {
                memcpy(l, d->logits, sizeof(float) * (size_t)V);
                for (int b = 0; b < r->n_bias; b++)
                    if (r->bias_ids[b] >= 0 && r->bias_ids[b] < V) l[r->bias_ids[b]] += r->bias[b];
                if (d->s->n_tokens - r->prompt_len < r->min_tokens) /* too early to stop */
                    for (int j = 0; j < r->n_stop; j++)
                        if (r->stop_ids[j] >= 0 && r->stop_ids[j] < V) l[r->stop_ids[j]] = -INFINITY;
            }
            d->tok = ctrl_sample_seq(&r->sampling, row, V, d->s->tokens, d->s->n_tokens, r->prompt_len,
                                     &d->s->rng, &d->logprob);
            if (d->tok >= 0 && r->top_logprobs > 0) {
                const int got = ctrl_sampling_top(row, V, r->top_logprobs, d->top_ids, d->top_lps);
                for (int j = got; j < r->top_logprobs; j++) d->top_ids[j] = -1, d->top_lps[j] = -INFINITY;
            }
        }
        free(l);
    }
    ctrl_status st = failed ? ctrl_error_set(CTRL_ERR_NOMEM, "generation: out of memory") : CTRL_OK;
    for (int i = 0; i < n && st == CTRL_OK; i++) st = record_token(e, e->draws[i].s, &e->draws[i]);
    free(top_ids), free(top_lps);
    return st;
}

/* Frees blocks by preempting the newest running sequence outside the step's batch; it will
 * prefill its prompt and completion again. Returns 0 when there is none. */
static int preempt(ctrl_engine *e, gen_seq *const *keep, int n_keep) {
    for (int i = e->n - 1; i >= 0; i--) {
        if (e->seqs[i].state != RUNNING) continue;
        int kept = 0;
        for (int k = 0; k < n_keep; k++) kept |= keep[k] == &e->seqs[i];
        if (kept) continue;
        ctrl_kv_seq_release(e->kv, &e->seqs[i].kv);
        e->seqs[i].state = WAITING;
        e->preemptions++;
        return 1;
    }
    return 0;
}

/* Finished sequences leave (their outputs are the caller's); the step's scratch fits the rest. */
static ctrl_status tidy(ctrl_engine *e) {
    int n = 0;
    for (int i = 0; i < e->n; i++)
        if (e->seqs[i].state == FINISHED)
            drop(e, &e->seqs[i]);
        else
            e->seqs[n++] = e->seqs[i];
    e->n = n;
    if (n == 0) e->stepped = 0;
    if (n > e->draws_cap) {
        gen_draw *d = realloc(e->draws, sizeof *d * (size_t)n);
        if (!d) return ctrl_error_set(CTRL_ERR_NOMEM, "generation: out of memory");
        e->draws = d, e->draws_cap = n;
    }
    const int want = n < e->cfg.max_num_seqs ? n : e->cfg.max_num_seqs;
    if (want <= e->scratch) return CTRL_OK;
    const int V = ctrl_model_cfg(e->model)->vocab_size, on_device = engine_draws_on_device(e);
    free(e->batch), free(e->n_new), free(e->kvs), free(e->logits);
    e->batch = malloc(sizeof(gen_seq *) * (size_t)want), e->n_new = malloc(sizeof(int) * (size_t)want);
    e->kvs = malloc(sizeof(ctrl_kv_seq *) * (size_t)want);
    /* the logits on the host only when the draws are there */
    e->logits = on_device ? NULL : malloc(sizeof(float) * (size_t)want * V);
    if (!e->tokens) e->tokens = malloc(sizeof(int32_t) * (size_t)e->cfg.max_num_batched_tokens);
    e->scratch = e->batch && e->n_new && e->kvs && (e->logits || on_device) && e->tokens ? want : 0;
    return e->scratch ? CTRL_OK : ctrl_error_set(CTRL_ERR_NOMEM, "generation: out of memory");
}

/* Blocks for the step's tokens, preempting when the pool is out: first a running sequence outside
 * the step, else the newest one scheduled in it (possibly this one: it waits). Returns the batch
 * size that got its blocks. */
static ctrl_status reserve(ctrl_engine *e, int *nb_io) {
    int nb = *nb_io;
    gen_seq **batch = e->batch;
    for (int b = 0; b < nb; b++) {
        while (ctrl_kv_seq_reserve(e->kv, &batch[b]->kv, batch[b]->kv.len + e->n_new[b]) != CTRL_OK) {
            const int need = (batch[b]->kv.len + e->n_new[b] + e->kv->block_size - 1) / e->kv->block_size -
                             batch[b]->kv.n_blocks;
            if (e->prefix && ctrl_prefix_cache_evict(e->prefix, e->kv, need) > 0) continue;
            if (preempt(e, batch, nb)) continue;
            if (nb > 1) {
                gen_seq *victim = batch[--nb];
                ctrl_kv_seq_release(e->kv, &victim->kv);
                if (victim->state == RUNNING) e->preemptions++;
                victim->state = WAITING;
                if (nb == b) break; /* it was this one */
                continue;
            }
            return ctrl_error_set(
                CTRL_ERR_NOMEM,
                "generation: the KV cache (%d blocks of %d tokens) cannot hold one sequence of "
                "%d tokens; raise kv_cache_bytes",
                e->kv->n_blocks, e->kv->block_size, batch[b]->kv.len + e->n_new[b]);
        }
    }
    *nb_io = nb;
    return CTRL_OK;
}

/* The first time a prompt is cached (its first sample's prefill is done) the other samples fork
 * from it and will draw their first token from the same logits. */
static ctrl_status fork_samples(ctrl_engine *e, gen_seq *s, const float *logits, int row, int *n_draws) {
    s->forked = 1;
    if (e->prefix && !s->rq->r.adapter)
        ctrl_prefix_cache_insert(e->prefix, e->kv, s->rq->r.prompt, s->rq->r.prompt_len, &s->kv);
    ctrl_status st = CTRL_OK;
    for (int i = 0; i < e->n && st == CTRL_OK; i++) {
        gen_seq *o = &e->seqs[i];
        if (o->rq != s->rq || o->state != FORK_PENDING) continue;
        int shared = 0;
        st = ctrl_kv_seq_fork(e->kv, &s->kv, &o->kv, &shared);
        if (st != CTRL_OK) break; /* no block to fork into: it prefills on its own */
        e->shared_blocks += shared;
        o->forked = 1, o->state = RUNNING;
        e->draws[(*n_draws)++] = (gen_draw){.s = o, .logits = logits, .row = row};
    }
    if (st == CTRL_ERR_NOMEM) { /* leave the others to prefill themselves */
        st = CTRL_OK;
        for (int i = 0; i < e->n; i++)
            if (e->seqs[i].rq == s->rq && e->seqs[i].state == FORK_PENDING)
                e->seqs[i].state = WAITING, e->seqs[i].forked = 1;
    }
    return st;
}

/* Phi-3's longrope (transformers' Phi3ForCausalLM.prepare_inputs_for_generation): when a sequence
 * outgrows the trained context (original_max_position_embeddings) while its cache holds no more than
 * that, the cache is dropped and the whole sequence computed again, now on the long factors -- here the
 * recompute a preemption does (its prompt and completion prefilled again, no prefix cache). */
static void longrope_recompute(ctrl_engine *e) {
    const ctrl_model_config *c = ctrl_model_cfg(e->model);
    const int orig = c->rope.original_max_position;
    if (c->rope.kind != CTRL_ROPE_LONGROPE || orig <= 0) return;
    for (int i = 0; i < e->n; i++) {
        gen_seq *s = &e->seqs[i];
        if (s->state != RUNNING || s->n_tokens < orig + 1 || s->kv.len > orig || s->kv.len >= s->n_tokens)
            continue;
        ctrl_kv_seq_release(e->kv, &s->kv);
        s->state = WAITING;
        e->longrope_recomputes++;
    }
}

ctrl_status ctrl_engine_step(ctrl_engine *e, int *active) {
    *active = 0;
    if (e->asleep)
        return ctrl_error_set(CTRL_ERR_RUNTIME, "generation: the engine is asleep (wake_up first)");
    ctrl_status st = tidy(e);
    if (st != CTRL_OK || e->n == 0) return st;
    const int V = ctrl_model_cfg(e->model)->vocab_size;
    longrope_recompute(e);
    /* 1. decode running sequences (one token each), 2. prefill chunks of waiting ones, each at most
     * prefill_chunk tokens: a long prompt takes a slice of every step rather than whole steps, so
     * the requests behind it start (and the running ones decode) meanwhile (engine_pick.c) */
    int nb = engine_pick(e), t = 0;
    if (nb > 0 && (st = reserve(e, &nb)) != CTRL_OK) return st;
    for (int b = 0; b < nb; b++) {
        memcpy(e->tokens + t, e->batch[b]->tokens + e->batch[b]->kv.len,
               sizeof(int32_t) * (size_t)e->n_new[b]);
        t += e->n_new[b];
        e->kvs[b] = &e->batch[b]->kv;
    }
    int *adapters = NULL; /* each sequence's LoRA adapter, when any runs under one: a mixed batch */
    for (int b = 0; b < nb && !adapters; b++)
        if (e->batch[b]->rq->r.adapter && !(adapters = malloc(sizeof(int) * (size_t)nb)))
            return ctrl_error_set(CTRL_ERR_NOMEM, "generation: out of memory");
    for (int b = 0; adapters && b < nb; b++) adapters[b] = e->batch[b]->rq->r.adapter;
    ctrl_model_set_decode_adapters(e->model, adapters);
    /* the step (decoding and drawing) on the threads [generation] decode_threads chooses */
    ctrl_decode_threads threads;
    ctrl_decode_threads_enter(&threads, e->cfg.decode_threads, &e->threads_logged);
    if (nb > 0) st = ctrl_model_decode(e->model, e->kv, e->kvs, e->tokens, e->n_new, nb, e->logits);
    ctrl_model_set_decode_adapters(e->model, NULL);
    free(adapters);
    e->steps++, e->stepped = 1;
    int n_draws = 0;
    for (int b = 0; b < nb && st == CTRL_OK; b++) {
        gen_seq *s = e->batch[b];
        if (s->kv.len < s->n_tokens) continue; /* prefill not done yet */
        s->state = RUNNING;
        const float *row = e->logits ? e->logits + (size_t)b * V : NULL; /* NULL: on the device */
        if (!s->forked) st = fork_samples(e, s, row, b, &n_draws);
        e->draws[n_draws++] = (gen_draw){.s = s, .logits = row, .row = b};
    }
    if (st == CTRL_OK && n_draws > 0) st = draw_all(e, n_draws);
    ctrl_decode_threads_leave(&threads);
    for (int i = 0; i < e->n && st == CTRL_OK; i++) *active |= e->seqs[i].state != FINISHED;
    if (st == CTRL_OK && !*active) tidy(e); /* idle: nothing left behind */
    return st;
}
