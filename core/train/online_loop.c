/* The online trainers' side of the training loop (see online.h): generation batches from the
 * engine on the live weights, rewards, advantages, old and reference log-probs, and micro-batches
 * of prompt + completion sequences whose completion tokens are trained. */
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cJSON.h>

#include "clock.h"
#include "collective/collective.h"
#include "file_text.h"
#include "generate/engine.h"
#include "generate/remote_engine.h"
#include "train/data_parallel.h"
#include "train/moe_aux.h"
#include "train/online_internal.h"

ctrl_status ctrl_online_create(const ctrl_config *cfg, const ctrl_run_plugins *plugins, ctrl_model *model,
                               const ctrl_tokenizer *tok, const ctrl_trainer_ops *ops, ctrl_trainer *trainer,
                               ctrl_model *ref, int zero3, ctrl_online **out) {
    ctrl_online *o = calloc(1, sizeof *o);
    if (!o) return ctrl_error_set(CTRL_ERR_NOMEM, "online: out of memory");
    const ctrl_run_settings *s = ctrl_config_settings(cfg);
    *o =
        (ctrl_online){.cfg = cfg, .model = model, .tok = tok, .ops = ops, .trainer = trainer, .zero3 = zero3};
    o->spec.size = sizeof o->spec;
    ctrl_status st = ops->online_spec(trainer, &o->spec);
    if (st == CTRL_OK && s->generation.server)
        st = ctrl_remote_server_init(&o->server, s->generation.server_url, s->run.output_dir);
    const int ga = s->train.gradient_accumulation_steps;
    const int bs = ctrl_online_micro_batch(&o->spec, s->train.per_device_train_batch_size);
    o->bs = bs;
    const int spg = o->spec.steps_per_generation > 0 ? o->spec.steps_per_generation : ga;
    const int G = o->spec.num_generations;
    if (st == CTRL_OK && (G < 1 || (bs * spg) % G != 0))
        st = ctrl_error_set(
            CTRL_ERR_CONFIG,
            "the generation batch (per_device_train_batch_size %d x steps_per_generation %d = %d "
            "completions) must be a multiple of num_generations (%d)",
            bs, spg, bs * spg, G);
    const char *train_file = s->data.train_file;
    const char *eval_file = s->data.eval_file;
    if (st == CTRL_OK && !train_file)
        st = ctrl_error_set(CTRL_ERR_CONFIG, "[data] train_file: an online trainer needs a prompt file");
    if (st == CTRL_OK) st = ctrl_prompt_set_load(train_file, tok, cfg, &o->train);
    if (st == CTRL_OK && eval_file) st = ctrl_prompt_set_load(eval_file, tok, cfg, &o->eval);
    if (st == CTRL_OK) st = ctrl_reward_set_create(cfg, plugins, &o->rewards);
    const char *path = s->model.path;
    o->sampling = ctrl_generation_sampling(s, s->generation.temperature);
    /* the trained log-probs are those of the sampling distribution's temperature, as TRL's */
    const float temp =
        o->sampling.temperature > 0 && !o->spec.logp_at_unit_temperature ? o->sampling.temperature : 1.0f;
    ctrl_model_set_temperature(model, temp);
    /* the reference: the initial weights, frozen; with LoRA the base itself, the adapters switched off
     * for its log-probs (TRL's disable_adapter): no second copy */
    if (st == CTRL_OK && ref) { /* the caller's (zero3: sliced, placed and set up as the policy) */
        o->ref = ref, o->ref_borrowed = 1;
        ctrl_model_set_temperature(ref, temp);
    } else if (st == CTRL_OK && o->spec.needs_ref_logp && !ctrl_model_lora(model)) {
        st = ctrl_model_load(path, plugins->attention->ops, &o->ref);
        if (st == CTRL_OK) ctrl_model_set_temperature(o->ref, temp);
        if (st == CTRL_OK && ctrl_model_device(model).type != CTRL_DEVICE_CPU) /* beside the policy */
            st = ctrl_model_to_device(o->ref, ctrl_model_backend(model), ctrl_model_device(model));
        if (st == CTRL_OK) st = ctrl_model_set_compute_like(o->ref, model);
        if (st == CTRL_OK) st = ctrl_model_set_recompute_all(o->ref); /* forwards only */
        if (st != CTRL_OK) ctrl_error_wrap(st, "the reference model (%s)", path);
    }
    o->n_stop = ctrl_generation_stop_ids(path, tok, o->stops, 16);
    if (o->spec.stop == CTRL_ONLINE_STOP_EOS) o->stops[0] = ctrl_tokenizer_eos_id(tok), o->n_stop = 1;
    if (o->spec.stop == CTRL_ONLINE_STOP_ID) o->stops[0] = o->spec.stop_token_id, o->n_stop = 1;
    if (o->spec.stop == CTRL_ONLINE_STOP_NONE) o->n_stop = 0;
    if (st == CTRL_OK && o->spec.value_model) st = online_value_create(o, plugins);
    o->seed = s->run.seed;
    if (st == CTRL_OK && s->generation.log_completions && ctrl_collective_is_root()) {
        char p[4200];
        snprintf(p, sizeof p, "%s/completions.jsonl", s->run.output_dir);
        if (!(o->completions = fopen(p, "a"))) st = ctrl_error_set(CTRL_ERR_IO, "%s: cannot open it", p);
    }
    o->sleep_level = s->generation.sleep;
    ctrl_engine_config ec;
    if (st == CTRL_OK && !o->server.url) st = ctrl_engine_config_for(cfg, model, &ec); /* its KV pool */
    if (st == CTRL_OK && o->server.url) { /* the server generates from the trainer's weights from the start:
                                           * pushed before its first generation (ctrl_remote_server_sync) */
        st = ctrl_remote_wait_ready(o->server.url, 240); /* TRL: vllm_server_timeout = 240 s */
        if (st == CTRL_OK)
            CTRL_INFO("generation: ctrl serve at %s (weights pushed after each step)", o->server.url);
    } else if (st == CTRL_OK) {
        st = ctrl_engine_attach_attention(model, plugins->decoder);
        if (st == CTRL_OK) st = ctrl_engine_create(model, &ec, &o->engine);
        if (st == CTRL_OK && o->sleep_level) st = ctrl_engine_sleep(o->engine, o->sleep_level);
    }
    if (st != CTRL_OK) {
        ctrl_online_free(o);
        return st;
    }
    *out = o;
    return CTRL_OK;
}

int ctrl_online_prompt_count(const ctrl_online *o) { return o->train.n; }

void online_flat_free(online_flat *f) { free(f->tok), free(f->pos), free(f->tg), free(f->cu), free(f->at); }

ctrl_status online_flat_build(const ctrl_online *o, const ctrl_prompt_set *ps, int c0, int n,
                              online_flat *f) {
    size_t T = 0;
    for (int i = 0; i < n; i++) T += (size_t)ps->len[o->gprompt[c0 + i]] + (size_t)o->gout[c0 + i].len;
    const int max_len = o->spec.max_length;
    f->tok = malloc(sizeof(int32_t) * T), f->pos = malloc(sizeof(int32_t) * T),
    f->tg = malloc(sizeof(int32_t) * T);
    f->cu = malloc(sizeof(int32_t) * (size_t)(n + 1)), f->at = malloc(sizeof(int) * (size_t)n);
    if (!f->tok || !f->pos || !f->tg || !f->cu || !f->at) {
        online_flat_free(f);
        return ctrl_error_set(CTRL_ERR_NOMEM, "online: out of memory for a batch of %zu tokens", T);
    }
    int t = 0;
    for (int i = 0; i < n; i++) {
        const int p = o->gprompt[c0 + i];
        const ctrl_gen_output *g = &o->gout[c0 + i];
        /* max_length: the prompt's leftmost tokens are dropped (never the whole prompt) */
        int cut = max_len > 0 && ps->len[p] + g->len > max_len ? ps->len[p] + g->len - max_len : 0;
        if (cut > ps->len[p] - 1) cut = ps->len[p] - 1;
        const int32_t *prompt = ps->ids[p] + cut;
        const int P = ps->len[p] - cut;
        f->cu[i] = t, f->at[i] = t + P - 1;
        for (int j = 0; j < P + g->len; j++, t++) {
            f->tok[t] = j < P ? prompt[j] : g->ids[j - P];
            f->pos[t] = j;
            f->tg[t] = j >= P - 1 && j - P + 1 < g->len ? g->ids[j - P + 1] : -100;
        }
    }
    f->cu[n] = t;
    f->b = (ctrl_batch){
        .T = t, .B = n, .tokens = f->tok, .positions = f->pos, .cu_seqlens = f->cu, .targets = f->tg};
    return CTRL_OK;
}

/* Per-completion log-probs under `m` (no gradient kept) of the completions this rank trains on
 * (online_ranks.c: bs at a time; the whole batch on one rank). */
static ctrl_status completion_logps(ctrl_online *o, ctrl_model *m, int bs, float **dst) {
    /* under zero3 the forwards are collectives (the policy's and a sliced reference's layers gathered
     * around each use): every rank runs the same number, in the same order -- the batch holds N x bs x
     * steps_per_generation completions (new_generation_batch), bs x steps_per_generation a rank */
    const int N = ctrl_collective_size();
    if (N > 1 && o->gn % (bs * N) != 0)
        return ctrl_error_set(
            CTRL_ERR_RUNTIME,
            "online: %d completions do not split into micro-batches of %d over %d ranks alike", o->gn, bs, N);
    ctrl_status st = CTRL_OK;
    for (int c0 = 0; c0 < o->gn && st == CTRL_OK; c0 += bs) {
        if (!online_mine(o, c0)) continue;
        const int n = c0 + bs <= o->gn ? bs : o->gn - c0;
        online_flat f;
        if ((st = online_flat_build(o, &o->train, c0, n, &f)) != CTRL_OK) break;
        float *lp = malloc(sizeof(float) * (size_t)f.b.T);
        st = lp ? ctrl_model_forward(m, &f.b, lp, NULL, NULL)
                : ctrl_error_set(CTRL_ERR_NOMEM, "online: out of memory");
        for (int i = 0; st == CTRL_OK && i < n; i++) {
            dst[c0 + i] = malloc(sizeof(float) * (size_t)(o->gout[c0 + i].len + 1));
            if (!dst[c0 + i])
                st = ctrl_error_set(CTRL_ERR_NOMEM, "online: out of memory");
            else
                memcpy(dst[c0 + i], lp + f.at[i], sizeof(float) * (size_t)o->gout[c0 + i].len);
        }
        free(lp);
        online_flat_free(&f);
    }
    return st;
}

static void gen_batch_free(ctrl_online *o) {
    for (int i = 0; i < o->gn; i++) {
        ctrl_gen_output_free(&o->gout[i]);
        if (o->old) free(o->old[i]);
        if (o->ref_lp) free(o->ref_lp[i]);
    }
    free(o->gout), free(o->gprompt), free(o->trained), free(o->adv), free(o->old), free(o->ref_lp);
    o->gout = NULL, o->gprompt = o->trained = NULL, o->adv = NULL, o->old = o->ref_lp = NULL, o->gn = 0;
}

void ctrl_online_set_whole_weights(ctrl_online *o, ctrl_status (*whole)(void *ctx, int on), void *ctx,
                                   ctrl_status (*gather)(void *ctx, int on), void *gather_ctx) {
    o->whole_weights = whole, o->whole_ctx = ctx;
    o->server.whole = gather, o->server.whole_ctx = gather_ctx;
}

/* Generates for `ps` prompts order[*cursor ...]: n_prompts requests of `n` samples each, of which
 * this rank samples requests [own0, own0 + n_own), or with `sel` the n_own requests sel[0..n_own)
 * (either way seeded by their place in the whole batch, so that the samples are one process's). */
static ctrl_status generate(ctrl_online *o, const ctrl_prompt_set *ps, const int *order, long *cursor,
                            int n_prompts, int n, int own0, int n_own, const int *sel,
                            const ctrl_sampling_params *sp) {
    gen_batch_free(o);
    const int gn = n_prompts * n;
    o->gout = calloc((size_t)gn, sizeof *o->gout), o->gprompt = malloc(sizeof(int) * (size_t)gn);
    o->trained = malloc(sizeof(int) * (size_t)gn), o->adv = calloc((size_t)gn, sizeof(float));
    ctrl_gen_request *req = calloc((size_t)n_prompts, sizeof *req);
    if (!o->gout || !o->gprompt || !o->trained || !o->adv || !req) {
        free(req);
        gen_batch_free(o); /* gn is still 0: nothing inside to free */
        return ctrl_error_set(CTRL_ERR_NOMEM, "online: out of memory for %d completions", gn);
    }
    o->gn = gn;
    /* seeded by the run's seed and the prompt cursor, so that a resumed run samples what the
     * uninterrupted one would have (eval batches: a fixed stream of their own) */
    const uint64_t batch_seed = o->seed * 1000003u + (cursor ? (uint64_t)*cursor : 0x9e3779b9u);
    for (int i = 0; i < n_prompts; i++) {
        const int p = order ? order[(*cursor)++ % ps->n] : i;
        for (int k = 0; k < n; k++) o->gprompt[i * n + k] = p;
        req[i] = (ctrl_gen_request){.prompt = ps->ids[p],
                                    .prompt_len = ps->len[p],
                                    .n = n,
                                    .max_tokens = o->spec.max_completion_length,
                                    .sampling = *sp,
                                    .seed = batch_seed * 7919u + (uint64_t)i,
                                    .stop_ids = o->stops,
                                    .n_stop = o->n_stop};
    }
    /* this rank's requests and their outputs: in place, or (sel) gathered into arrays of their own
     * and the outputs moved to their places after */
    ctrl_gen_request *mine = req + own0;
    ctrl_gen_output *out = o->gout + (size_t)own0 * n;
    if (sel) {
        mine = malloc(sizeof *mine * (size_t)(n_own > 0 ? n_own : 1));
        out = calloc((size_t)(n_own > 0 ? n_own : 1) * (size_t)n, sizeof *out);
        if (!mine || !out) {
            free(mine), free(out), free(req);
            return ctrl_error_set(CTRL_ERR_NOMEM, "online: out of memory for %d requests", n_own);
        }
        for (int j = 0; j < n_own; j++) mine[j] = req[sel[j]];
    }
    ctrl_status st;
    if (o->server.url) {
        st = ctrl_remote_server_sync(&o->server, o->model); /* the start's weights, once (every rank) */
        /* the server seeds a call's requests from the first one's seed up: one call for each run of
         * consecutive requests (with sel: each eval batch), so that each keeps its own seed */
        for (int j = 0, e; st == CTRL_OK && j < n_own; j = e) {
            for (e = j + 1; e < n_own && (!sel || sel[e] == sel[e - 1] + 1);) e++;
            st = ctrl_remote_generate(o->server.url, o->server.bearer, mine + j, e - j, out + (size_t)j * n);
        }
    } else {
        st = o->whole_weights ? o->whole_weights(o->whole_ctx, 1) : CTRL_OK; /* ZeRO-3: gathered */
        if (st == CTRL_OK) st = ctrl_engine_wake_up(o->engine);
        if (st == CTRL_OK && n_own > 0) st = ctrl_engine_generate(o->engine, mine, n_own, out, NULL, NULL);
        if (st == CTRL_OK && o->sleep_level) st = ctrl_engine_sleep(o->engine, o->sleep_level);
        const ctrl_status rel = o->whole_weights ? o->whole_weights(o->whole_ctx, 0) : CTRL_OK;
        if (st == CTRL_OK) st = rel;
    }
    if (sel) { /* moved, whatever the outcome: gen_batch_free frees what a failed run left */
        for (int j = 0; j < n_own; j++)
            for (int k = 0; k < n; k++) o->gout[(size_t)sel[j] * n + k] = out[(size_t)j * n + k];
        free(mine), free(out);
    }
    free(req);
    return st;
}

/* A new generation batch for training: generated, scored, with old / reference log-probs as the
 * trainer needs them, and advantages. Returns the prompt + completion tokens it holds. */
static ctrl_status new_generation_batch(ctrl_online *o, const int *order, long *cursor, int bs, int ga,
                                        long *tokens) {
    const int spg = o->spec.steps_per_generation > 0 ? o->spec.steps_per_generation : ga;
    const int G = o->spec.num_generations, N = ctrl_collective_size(), rank = ctrl_collective_rank();
    /* N ranks: the batch of N x bs x spg completions one process would make, each rank sampling
     * and scoring a block of its prompts, then gathered (online_ranks.c) */
    const int P = bs * spg / G * N, own0 = P / N * rank, n_own = P / N;
    double t0 = ctrl_now();
    const double cpu0 = ctrl_clock_seconds(CLOCK_PROCESS_CPUTIME_ID); /* user + system, every thread */
    const double epoch = (double)*cursor / (o->train.n > 0 ? o->train.n : 1);
    ctrl_status st = generate(o, &o->train, order, cursor, P, G, own0, n_own, NULL, &o->sampling);
    const double gen_cpu = ctrl_clock_seconds(CLOCK_PROCESS_CPUTIME_ID) - cpu0;
    float *scores = NULL, *total = NULL, *kl = NULL;
    int *ntok = NULL, *stopped = calloc((size_t)(o->gn > 0 ? o->gn : 1), sizeof(int));
    if (st == CTRL_OK && !stopped) st = ctrl_error_set(CTRL_ERR_NOMEM, "online: out of memory");
    double t1 = ctrl_now();
    ctrl_online_report(o, "timing/generation_s", t1 - t0);
    ctrl_online_report(o, "timing/generation_cpu_s", gen_cpu);
    if (st == CTRL_OK) st = online_score(o, &o->train, own0 * G, n_own * G, &scores, &total);
    if (st == CTRL_OK) st = online_gather(o, own0 * G, n_own * G, scores, total);
    t0 = ctrl_now();
    ctrl_online_report(o, "timing/reward_s", t0 - t1);
    o->gen_items = 0;
    for (int i = 0; st == CTRL_OK && i < o->gn; i++) {
        o->trained[i] = !(o->spec.mask_truncated_completions && !o->gout[i].stopped);
        stopped[i] = o->gout[i].stopped;
        o->gen_items += o->trained[i] * o->gout[i].len;
        if (online_mine(o, i)) *tokens += o->train.len[o->gprompt[i]] + o->gout[i].len;
    }
    /* TRL computes old log-probs only when the policy moves between generation and training */
    const int need_old = o->spec.needs_old_logp || ga % (spg * o->spec.num_iterations) != 0;
    if (st == CTRL_OK && need_old) {
        o->old = calloc((size_t)o->gn, sizeof(float *));
        st = o->old ? completion_logps(o, o->model, bs, o->old)
                    : ctrl_error_set(CTRL_ERR_NOMEM, "online: out of memory");
    }
    if (st == CTRL_OK && o->spec.needs_ref_logp) {
        o->ref_lp = calloc((size_t)o->gn, sizeof(float *));
        if (!o->ref) ctrl_model_set_adapters_enabled(o->model, 0);
        st = o->ref_lp ? completion_logps(o, o->ref ? o->ref : o->model, bs, o->ref_lp)
                       : ctrl_error_set(CTRL_ERR_NOMEM, "online: out of memory");
        if (!o->ref) ctrl_model_set_adapters_enabled(o->model, 1);
    }
    if (need_old || o->spec.needs_ref_logp)
        ctrl_online_report(o, "timing/old_ref_logprob_s", ctrl_now() - t0);
    if (st == CTRL_OK && o->old && o->ref_lp) { /* the KL summed over each completion (RLOO's reward) */
        kl = calloc((size_t)o->gn, sizeof(float)), ntok = calloc((size_t)o->gn, sizeof(int));
        if (!kl || !ntok) st = ctrl_error_set(CTRL_ERR_NOMEM, "online: out of memory");
        for (int i = 0; st == CTRL_OK && i < o->gn; i++)
            for (int j = 0; o->old[i] && o->trained[i] && j < o->gout[i].len; j++)
                kl[i] += o->old[i][j] - o->ref_lp[i][j], ntok[i]++;
        if (st == CTRL_OK) st = online_gather_kl(o, kl, ntok); /* each rank has its slices' */
    }
    if (st == CTRL_OK && o->value) {
        online_generation_metrics(o, scores, total);
        /* the rollout (GAE, whitening) is over the whole generation batch on every rank */
        st = online_gather_rows(o, o->old);
        if (st == CTRL_OK) st = online_gather_rows(o, o->ref_lp);
        if (st == CTRL_OK) st = online_value_rollout(o, total, bs);
    } else if (st == CTRL_OK) {
        online_generation_metrics(o, scores, total);
        ctrl_rollout ro = {.size = sizeof ro,
                           .n = o->gn,
                           .group = G,
                           .rewards = total,
                           .kl = kl,
                           .n_tokens = ntok,
                           .report = online_report,
                           .report_ctx = o,
                           .stopped = stopped,
                           .epoch = epoch};
        st = o->ops->advantages(o->trainer, &ro, o->adv);
    }
    if (st == CTRL_OK && o->completions) online_log_completions(o, scores);
    free(scores), free(total), free(kl), free(ntok), free(stopped);
    o->used = 0;
    o->batches++;
    return st;
}

/* 1 when this micro-batch's dL/dlogp can be had before its forward (the trainer's spec says so for
 * batches without old or reference log-probs and values; ctrl_online_spec.dlogp_before_forward):
 * the LM head's backward is then fused into the forward, as SFT's (CTRL_NO_FUSED_ONLINE_HEAD=1: not). */
static int fused_loss_first(const ctrl_online *o) {
    const ctrl_online_spec *sp = &o->spec;
    const char *off = getenv("CTRL_NO_FUSED_ONLINE_HEAD");
    return sp->size >= offsetof(ctrl_online_spec, dlogp_before_forward) + sizeof sp->dlogp_before_forward &&
           sp->dlogp_before_forward && !o->old && !o->ref_lp && !o->value && !(off && off[0] == '1');
}

/* The trainer's dL/dlogp on zero log-probs, no entropies and no metrics (into d, [T]). */
static ctrl_status loss_before_forward(ctrl_online *o, const ctrl_trainer_batch *tb, float *d) {
    ctrl_trainer_batch pre = *tb;
    float *zero = calloc((size_t)(tb->T > 0 ? tb->T : 1), sizeof(float));
    if (!zero) return ctrl_error_set(CTRL_ERR_NOMEM, "online: out of memory");
    pre.logp = zero, pre.entropy = NULL, pre.report = NULL, pre.report_ctx = NULL;
    double l = 0;
    const ctrl_status st = o->ops->loss(o->trainer, &pre, &l, d);
    free(zero);
    return st;
}

/* One micro-batch: completions [c0, c0 + n) forward, the trainer's loss, backward. */
static ctrl_status micro_batch(ctrl_online *o, int c0, int n, int ga, int spg, double *loss) {
    const double t0 = ctrl_now();
    online_flat f;
    ctrl_status st = online_flat_build(o, &o->train, c0, n, &f);
    if (st != CTRL_OK) return st;
    const size_t T = (size_t)f.b.T;
    float *lp = malloc(sizeof(float) * T), *ent = malloc(sizeof(float) * T), *w = calloc(T, sizeof(float));
    float *old = o->old ? calloc(T, sizeof(float)) : NULL, *ref = o->ref_lp ? calloc(T, sizeof(float)) : NULL;
    float *d = malloc(sizeof(float) * T);
    if (!lp || !ent || !w || !d || (o->old && !old) || (o->ref_lp && !ref))
        st = ctrl_error_set(CTRL_ERR_NOMEM, "online: out of memory for a micro-batch of %zu tokens", T);
    for (int i = 0; st == CTRL_OK && i < n; i++)
        for (int j = 0; j < o->gout[c0 + i].len; j++) {
            const int t = f.at[i] + j;
            w[t] = (float)o->trained[c0 + i];
            if (old) old[t] = o->old[c0 + i][j];
            if (ref) ref[t] = o->ref_lp[c0 + i][j];
        }
    ctrl_trainer_batch tb = {.size = sizeof tb,
                             .T = f.b.T,
                             .logp = lp,
                             .weight = w,
                             .num_items = o->gen_items * ga / spg / ctrl_collective_size(),
                             .n_seq = n,
                             .cu_seqlens = f.cu,
                             .advantages = o->adv + c0,
                             .old_logp = old,
                             .ref_logp = ref,
                             .entropy = ent,
                             .grad_accum = ga,
                             .report = online_report,
                             .report_ctx = o};
    /* dL/dlogp before the forward where it does not depend on it (see fused_loss_first) */
    float *d0 = st == CTRL_OK && fused_loss_first(o) ? malloc(sizeof(float) * T) : NULL;
    if (d0) st = loss_before_forward(o, &tb, d0);
    if (st == CTRL_OK)
        st = d0 ? ctrl_model_forward_fused(o->model, &f.b, d0, lp, ent, NULL)
                : ctrl_model_forward(o->model, &f.b, lp, ent, NULL);
    const int valued = st == CTRL_OK && o->value;
    if (valued) st = online_value_batch(o, c0, n, &f, w, &tb);
    double l = 0;
    if (st == CTRL_OK) st = o->ops->loss(o->trainer, &tb, &l, d);
    if (st == CTRL_OK && d0 && memcmp(d, d0, sizeof(float) * T) != 0)
        st = ctrl_error_set(CTRL_ERR_PLUGIN,
                            "trainer %s: dL/dlogp after the forward differs from the one before it (its "
                            "online spec says dlogp_before_forward)",
                            ctrl_config_settings(o->cfg)->run.trainer);
    double aux =
        0; /* TRL's load-balancing loss over the batch's tokens (train/moe_aux.h; flat, no padding) */
    if (st == CTRL_OK)
        st = train_moe_aux_add(o->model, train_moe_aux_coef(ctrl_config_settings(o->cfg), o->model), NULL, ga,
                               1, &l, &aux, online_report, o);
    if (st == CTRL_OK) *loss += l, st = ctrl_model_backward(o->model, d0 ? NULL : d);
    if (valued) {
        const ctrl_status vs = online_value_backward(o, &tb, st == CTRL_OK);
        if (st == CTRL_OK) st = vs;
    }
    ctrl_online_report(o, "timing/forward_backward_s", ctrl_now() - t0);
    free(lp), free(ent), free(w), free(old), free(ref), free(d), free(d0);
    online_flat_free(&f);
    return st;
}

ctrl_status ctrl_online_accumulate(ctrl_online *o, const int *order, long *cursor, int bs, int ga,
                                   double *loss, long *tokens) {
    bs = ctrl_online_micro_batch(&o->spec, bs);
    const int spg = o->spec.steps_per_generation > 0 ? o->spec.steps_per_generation : ga;
    ctrl_status st = o->value ? online_value_zero_grad(o) : CTRL_OK;
    for (int g = 0; g < ga && st == CTRL_OK; g++) {
        if (!o->gout || o->used >= spg * o->spec.num_iterations)
            st = new_generation_batch(o, order, cursor, bs, ga, tokens);
        if (st == CTRL_OK && o->spec.shuffle && o->value && o->used % spg == 0) online_value_shuffle(o);
        if (st == CTRL_OK) st = micro_batch(o, online_slice(o, o->used % spg), bs, ga, spg, loss);
        o->used++;
    }
    return st;
}

/* The evaluation (TRL's, the HF Trainer's evaluation loop over an eval dataloader Accelerate
 * shards): the eval prompts in file order, in batches of per_device_eval_batch_size completions --
 * whole groups of num_generations, so per_device_eval_batch_size / num_generations prompts (at least
 * one) -- batch b on rank b % N (train_dp_eval_mine). Each rank samples its batches' completions with
 * the training's sampling settings, each prompt seeded by its place in the eval set (from a stream of
 * the evaluation's own, the same at every evaluation: the samples one process draws), and scores them
 * a batch at a time; the sums and counts of the rewards that are not NaN (the total and each
 * function's) are added over the ranks (train_dp_eval_reduce), so that the means rank 0 writes are
 * one process's over the whole set (online_nanmean's), within the summation order's rounding. */
int ctrl_online_has_eval(const ctrl_online *o) { return o->eval.n > 0; }

ctrl_status ctrl_online_evaluate(ctrl_online *o, long step, FILE *f) {
    if (!o->eval.n) return CTRL_OK;
    const int G = o->spec.num_generations, n = o->eval.n, R = ctrl_reward_set_count(o->rewards);
    const int per = ctrl_config_settings(o->cfg)->train.per_device_eval_batch_size / G;
    const int k = per > 0 ? per : 1; /* prompts a batch */
    const long batches = (n + k - 1) / k;
    long mine = 0;
    int *sel = calloc((size_t)n, sizeof(int)), n_sel = 0;
    /* the total's sum and count, each function's, the batches evaluated */
    double *v = calloc((size_t)(3 + 2 * R), sizeof(double));
    ctrl_status st = sel && v ? CTRL_OK : ctrl_error_set(CTRL_ERR_NOMEM, "online: out of memory");
    for (long b = 0; st == CTRL_OK && b < batches; b++)
        if (train_dp_eval_mine(b)) {
            mine++;
            for (long p = b * k; p < (b + 1) * k && p < n; p++) sel[n_sel++] = (int)p;
        }
    /* every rank, its share empty or not (server mode pushes the weights first: a collective) */
    if (st == CTRL_OK) st = generate(o, &o->eval, NULL, NULL, n, G, 0, n_sel, sel, &o->sampling);
    for (long b = 0; st == CTRL_OK && b < batches; b++) {
        if (!train_dp_eval_mine(b)) continue;
        const int c0 = (int)(b * k) * G, m = ((b + 1) * k <= n ? k : n - (int)(b * k)) * G;
        float *scores = NULL, *total = NULL;
        st = online_score(o, &o->eval, c0, m, &scores, &total);
        for (int i = c0; st == CTRL_OK && i < c0 + m; i++) {
            if (!isnan(total[i])) v[0] += total[i], v[1]++;
            for (int r = 0; r < R; r++)
                if (!isnan(scores[(size_t)i * R + r]))
                    v[2 + 2 * r] += scores[(size_t)i * R + r], v[3 + 2 * r]++;
        }
        free(scores), free(total);
    }
    /* the outcome agreed (a rank's failure fails every rank, naming it), the sums added */
    if (v) v[2 + 2 * R] = (double)mine;
    st = train_dp_eval_reduce(st, v, v ? (size_t)(3 + 2 * R) : 0);
    if (st == CTRL_OK && f) {
        char name[160], note[160];
        fprintf(f, "{\"step\": %ld, ", step);
        const double mean = v[1] > 0 ? v[0] / v[1] : NAN;
        online_write_metric(f, "eval_reward", mean);
        for (int r = 0; r < R; r++) {
            snprintf(name, sizeof name, "eval_rewards/%s/mean", ctrl_reward_set_name(o->rewards, r));
            online_write_metric(f, name, v[3 + 2 * r] > 0 ? v[2 + 2 * r] / v[3 + 2 * r] : NAN);
        }
        fprintf(f, "\"eval_prompts\": %d}\n", n);
        fflush(f);
        train_dp_eval_note(note, sizeof note, mine, (long)v[2 + 2 * R]); /* summed: one process's */
        CTRL_INFO("eval: mean reward %.4f over %d prompts x %d completions (%ld batches of %d prompts%s)",
                  mean, n, G, batches, k, note);
    }
    free(sel), free(v);
    gen_batch_free(o); /* the next training step generates anew */
    return st;
}

ctrl_status ctrl_online_optimizer_step(ctrl_online *o, double lr, long step) {
    return o->value ? online_value_step(o, lr, step) : CTRL_OK;
}

ctrl_status ctrl_online_save_state(ctrl_online *o, const char *dir) {
    return o->value ? online_value_save(o, dir) : CTRL_OK;
}

ctrl_status ctrl_online_save_serve(ctrl_online *o) { return o->value ? online_value_serve(o) : CTRL_OK; }

ctrl_status ctrl_online_load_state(ctrl_online *o, const char *dir, long step) {
    const ctrl_run_settings *s = ctrl_config_settings(o->cfg);
    const long ga = s->train.gradient_accumulation_steps;
    const long spg = o->spec.steps_per_generation > 0 ? o->spec.steps_per_generation : ga;
    const long per_batch = spg * o->spec.num_iterations; /* micro-batches a generation batch feeds */
    long every = per_batch, b = ga; /* the steps between batch boundaries: per_batch / gcd(per_batch, ga) */
    for (long a = per_batch; b;) {
        const long t = a % b;
        a = b, b = t, every = per_batch / a;
    }
    if ((step * ga) % per_batch != 0 && ctrl_collective_is_root())
        CTRL_WARN("resuming after step %ld, inside a generation batch of %ld micro-batches (%ld of them "
                  "trained): the resumed run samples a new batch where the uninterrupted one trained on "
                  "the rest of its batch, so its curve differs from there (checkpoints at multiples of "
                  "%ld steps resume on the same curve)",
                  step, per_batch, (step * ga) % per_batch, every);
    return o->value ? online_value_load(o, dir, step) : CTRL_OK;
}

ctrl_status ctrl_online_after_step(ctrl_online *o) {
    /* colocated (no url): the engine reads the live weights */
    return ctrl_remote_server_push(&o->server, o->model);
}

void ctrl_online_free(ctrl_online *o) {
    if (!o) return;
    ctrl_remote_server_free(&o->server);
    if (o->completions) fclose(o->completions);
    gen_batch_free(o);
    ctrl_prompt_set_free(&o->train), ctrl_prompt_set_free(&o->eval);
    ctrl_reward_set_free(o->rewards);
    if (o->engine) ctrl_engine_free(o->engine);
    if (!o->ref_borrowed) ctrl_model_free(o->ref);
    online_value_free(o);
    for (int i = 0; i < o->n_metrics; i++) free(o->mname[i]);
    free(o);
}
