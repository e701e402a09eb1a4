/* The distill kind (GKD; see kind.h): rows are SFT examples (prompt + completion); each
 * micro-batch trains the student on the divergence from a frozen teacher (train/teacher.h) over
 * its completion tokens, the divergence computed chunk by chunk from both heads
 * (ctrl_model_jsd_forward). As TRL's GKDTrainer.training_step, a micro-batch's completions are, with
 * probability lmbda, sampled by the student from the examples' prompts (on-policy, through the
 * generation engine on the live weights); else, with seq_kd, sampled by the teacher; else the
 * dataset's. The loss is normalised by the dataset's completion tokens of the accumulated batch
 * (TRL's num_items_in_batch, counted by the HF Trainer before the completions are replaced). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "clock.h"
#include "collective/collective.h"
#include "generate/engine.h"
#include "generate/remote_engine.h"
#include "train/data_parallel.h"
#include "train/kind.h"
#include "train/teacher.h"
#include "train/train.h"
#include "train/zero_ref.h"

#define DISTILL_METRICS 16

struct train_kind {
    const ctrl_trainer_distill_ops *ops;
    ctrl_trainer *trainer;
    ctrl_distill_spec spec;
    ctrl_model *model, *teacher;
    train_zero *teacher_zero; /* zero3 on several ranks: the teacher sliced (zero_ref.h), else NULL */
    /* zero3: the student gathered around its generation (kind.h's whole_weights; NULL: nothing) */
    ctrl_status (*whole_weights)(void *ctx, int on);
    void *whole_ctx;
    ctrl_dataset train, eval;
    int eval_bs, sleep_level;
    ctrl_engine *engine, *teacher_engine; /* made when lmbda > 0 (colocate) / seq_kd */
    ctrl_remote_server server;            /* [generation] mode = server with lmbda > 0 (url NULL: colocate) */
    ctrl_sampling_params sampling;
    int32_t stops[16];
    int n_stop;
    uint64_t seed;
    double teacher_exact; /* the teacher's eval exact match (NaN until measured) */
    const char *mname[DISTILL_METRICS];
    double msum[DISTILL_METRICS];
    long mcount[DISTILL_METRICS];
    int n_metrics;
};

/* The plugin's and the kind's metrics, as window means (names must be string literals). */
static void report(void *ctx, const char *name, double value) {
    train_kind *k = ctx;
    int i = 0;
    while (i < k->n_metrics && strcmp(k->mname[i], name) != 0) i++;
    if (i == k->n_metrics) {
        if (i == DISTILL_METRICS) return;
        k->mname[k->n_metrics++] = name, k->msum[i] = 0, k->mcount[i] = 0;
    }
    k->msum[i] += value, k->mcount[i]++;
}

static void distill_destroy(train_kind *k) {
    if (!k) return;
    if (k->engine) ctrl_engine_free(k->engine);
    ctrl_remote_server_free(&k->server);
    if (k->teacher_engine) ctrl_engine_free(k->teacher_engine);
    train_zero_ref_free(k->teacher_zero, k->teacher);
    ctrl_dataset_free(&k->train);
    ctrl_dataset_free(&k->eval);
    free(k);
}

/* The prompt of example e: its tokens before the first trained one (0: none). */
static int prompt_len(const ctrl_example *e) {
    int p = 0;
    while (p < e->len && !e->trained[p]) p++;
    return p < e->len ? p : 0;
}

static ctrl_status check_generation(const train_kind_env *env, train_kind *k) {
    const ctrl_config *cfg = env->cfg;
    const char *key = k->spec.lmbda > 0 ? "lmbda" : "seq_kd";
    const char *trainer = env->settings->run.trainer;
    if (strcmp(ctrl_config_where(cfg, "generation", "temperature"), "default") != 0)
        return ctrl_error_set(
            CTRL_ERR_CONFIG,
            "%s: [generation] temperature: trainer %s samples at its own [%s] temperature (as "
            "TRL's GKDConfig); set it there",
            ctrl_config_where(cfg, "generation", "temperature"), trainer, trainer);
    if (k->train.packed_from)
        return ctrl_error_set(
            CTRL_ERR_CONFIG,
            "%s: [data] packing: trainer %s samples completions from each example's prompt; "
            "packed rows have none",
            ctrl_config_where(cfg, "data", "packing"), trainer);
    for (int i = 0; i < k->train.n; i++)
        if (prompt_len(&k->train.ex[i]) == 0)
            return ctrl_error_set(
                CTRL_ERR_CONFIG,
                "[%s] %s: training example %d has no prompt to sample a completion from (use "
                "prompt-completion or conversational data with completion_only_loss)",
                trainer, key, i);
    return CTRL_OK;
}

static ctrl_status make_engine(const train_kind_env *env, ctrl_model *m, ctrl_engine **out) {
    ctrl_engine_config ec;
    ctrl_status st = ctrl_engine_config_for(env->cfg, m, &ec); /* a device's pool: its memory */
    if (st == CTRL_OK) st = ctrl_engine_attach_attention(m, env->plugins->decoder);
    if (st == CTRL_OK) st = ctrl_engine_create(m, &ec, out);
    return st;
}

static ctrl_status distill_after_step(train_kind *k, long step) {
    (void)step; /* server mode: rank 0 pushes, every rank waits (colocated: nothing to do) */
    return ctrl_remote_server_push(&k->server, k->model);
}

/* Server mode: the student's samples come from a running `ctrl serve`, which gets the student's
 * weights before its first generation (ctrl_remote_server_sync) and after every optimizer step
 * (distill_after_step), as the online kind's; under zero3 made readable for each push (train_zero_push). */
static ctrl_status connect_server(train_kind *k, const train_kind_env *env) {
    const ctrl_run_settings *s = env->settings;
    ctrl_status st = ctrl_remote_server_init(&k->server, s->generation.server_url, s->run.output_dir);
    k->server.whole = env->push_whole, k->server.whole_ctx = env->push_ctx;
    if (st == CTRL_OK) st = ctrl_remote_wait_ready(k->server.url, 240); /* TRL: vllm_server_timeout = 240 s */
    if (st == CTRL_OK)
        CTRL_INFO("generation: the student samples through ctrl serve at %s (weights pushed after each step)",
                  k->server.url);
    return st;
}

static ctrl_status distill_create(const train_kind_env *env, train_kind **out) {
    train_kind *k = calloc(1, sizeof *k);
    if (!k) return ctrl_error_set(CTRL_ERR_NOMEM, "train: out of memory");
    const ctrl_run_settings *s = env->settings;
    k->ops = env->trainer_ops->distill, k->trainer = env->trainer, k->model = env->model;
    k->eval_bs = s->train.per_device_eval_batch_size, k->seed = s->run.seed, k->teacher_exact = NAN;
    k->spec.size = sizeof k->spec;
    ctrl_status st = k->ops->distill_spec(k->trainer, &k->spec);
    if (st == CTRL_OK) st = ctrl_datasets_load(env->cfg, env->tok, &k->train, &k->eval);
    /* zero3 on several ranks: the teacher sliced as the student (TRL's prepare_deepspeed of the
     * teacher with the student's ZeRO-3 config; a LoRA student's too: its frozen base is sliced as a
     * full student's; on a CUDA model on the student's device), the student gathered whole for its
     * generation */
    k->whole_weights = env->whole_weights, k->whole_ctx = env->whole_ctx;
    if (st == CTRL_OK && env->zero3_frozen)
        st = train_teacher_load_sliced(env->cfg, env->model, env->tok, env->plugins->attention->ops,
                                       env->zero3_prefetch, &k->teacher, &k->teacher_zero);
    else if (st == CTRL_OK)
        st = train_teacher_load(env->cfg, env->model, env->tok, env->plugins->attention->ops, &k->teacher);
    const int generates = k->spec.lmbda > 0 || k->spec.seq_kd;
    if (st == CTRL_OK && generates) st = check_generation(env, k);
    if (st == CTRL_OK && generates) {
        k->sampling = ctrl_generation_sampling(s, k->spec.temperature);
        k->n_stop = ctrl_generation_stop_ids(s->model.path, env->tok, k->stops, 16);
        k->sleep_level = s->generation.sleep;
    }
    if (st == CTRL_OK && k->spec.lmbda > 0 && s->generation.server)
        st = connect_server(k, env);
    else if (st == CTRL_OK && k->spec.lmbda > 0)
        st = make_engine(env, k->model, &k->engine);
    if (st == CTRL_OK && k->spec.seq_kd) st = make_engine(env, k->teacher, &k->teacher_engine);
    if (st != CTRL_OK) {
        distill_destroy(k);
        return st;
    }
    *out = k;
    return CTRL_OK;
}

static int distill_rows(const train_kind *k) { return k->train.n; }
static long distill_rows_per_step(const train_kind *k, int bs, int ga) {
    (void)k;
    return (long)bs * ga;
}

static void distill_describe(const train_kind *k, long total, int bs, int ga, size_t n_params) {
    const ctrl_model_config *t = ctrl_model_cfg(k->teacher);
    CTRL_INFO("training: %d examples, %ld steps of %d x %d, %zu parameters; teacher %d layers x %d hidden "
              "(frozen), beta %.3g, lmbda %.3g%s",
              k->train.n, total, bs, ga, n_params, t->n_layers, t->hidden_size, k->spec.beta, k->spec.lmbda,
              k->spec.seq_kd ? ", seq_kd" : "");
}

/* splitmix64: the draw of micro-batch `i` (lmbda), a function of the seed alone, so a resumed run
 * draws what the uninterrupted one would have. */
static double uniform(uint64_t seed, uint64_t i) {
    uint64_t z = seed * 0x9e3779b97f4a7c15ull + i + 0x632be59bd9b4e019ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (double)(z >> 11) / 9007199254740992.0;
}

/* Completions of examples idx[0..n) sampled by `e`'s model (NULL: the server's) from their prompts (seeded
 * by the micro-batch's draw and each one's place i0 + i in the micro-batch over every rank), laid out
 * flat as prompt + completion with the completion tokens trained (every sampled token, the stop token
 * included: TRL's mask keeps the first EOS and drops what follows, which the engine never draws). */
static ctrl_status sample_batch(train_kind *k, ctrl_engine *e, const int *idx, int n, uint64_t draw, int i0,
                                ctrl_batch *b) {
    ctrl_gen_request *req = calloc((size_t)n, sizeof *req);
    ctrl_gen_output *gout = calloc((size_t)n, sizeof *gout);
    ctrl_status st = req && gout ? CTRL_OK : ctrl_error_set(CTRL_ERR_NOMEM, "train: out of memory");
    for (int i = 0; st == CTRL_OK && i < n; i++) {
        const ctrl_example *x = &k->train.ex[idx[i]];
        req[i] = (ctrl_gen_request){.prompt = x->ids,
                                    .prompt_len = prompt_len(x),
                                    .n = 1,
                                    .max_tokens = k->spec.max_new_tokens,
                                    .sampling = k->sampling,
                                    .seed = (k->seed * 1000003u + draw) * 7919u + (uint64_t)(i0 + i),
                                    .stop_ids = k->stops,
                                    .n_stop = k->n_stop};
    }
    if (st == CTRL_OK && !e) { /* the student, through the server (the start's weights pushed once) */
        st = ctrl_remote_server_sync(&k->server, k->model);
        if (st == CTRL_OK) st = ctrl_remote_generate(k->server.url, k->server.bearer, req, n, gout);
    } else if (st == CTRL_OK) {
        /* zero3: the model whole around its generation (TRL's unwrap_model_for_generation gathers
         * the student's or the teacher's ZeRO-3 parameters), released after */
        const int student = e == k->engine;
        st = student ? (k->whole_weights ? k->whole_weights(k->whole_ctx, 1) : CTRL_OK)
                     : train_zero_ref_whole(k->teacher_zero, 1);
        if (st == CTRL_OK) st = ctrl_engine_wake_up(e);
        if (st == CTRL_OK) st = ctrl_engine_generate(e, req, n, gout, NULL, NULL);
        if (st == CTRL_OK && k->sleep_level) st = ctrl_engine_sleep(e, k->sleep_level);
        const ctrl_status rel = student ? (k->whole_weights ? k->whole_weights(k->whole_ctx, 0) : CTRL_OK)
                                        : train_zero_ref_whole(k->teacher_zero, 0);
        if (st == CTRL_OK) st = rel;
    }
    size_t T = 0;
    for (int i = 0; i < n; i++) T += (size_t)req[i].prompt_len + (size_t)gout[i].len;
    int32_t *mem = st == CTRL_OK ? malloc(sizeof(int32_t) * (3 * T + (size_t)n + 1)) : NULL;
    if (st == CTRL_OK && !mem) st = ctrl_error_set(CTRL_ERR_NOMEM, "train: out of memory for %zu tokens", T);
    if (st == CTRL_OK) {
        int32_t *tok = mem, *pos = mem + T, *tg = mem + 2 * T, *cu = mem + 3 * T;
        int t = 0;
        for (int i = 0; i < n; i++) {
            const int P = req[i].prompt_len, L = P + gout[i].len;
            cu[i] = t;
            for (int j = 0; j < L; j++, t++) {
                tok[t] = j < P ? req[i].prompt[j] : gout[i].ids[j - P];
                pos[t] = j;
                tg[t] = j >= P - 1 && j + 1 < L ? gout[i].ids[j + 1 - P] : -100;
            }
        }
        cu[n] = t;
        *b = (ctrl_batch){.T = t, .B = n, .tokens = tok, .positions = pos, .targets = tg, .cu_seqlens = cu};
    }
    for (int i = 0; gout && i < n; i++) ctrl_gen_output_free(&gout[i]);
    free(req), free(gout);
    return st;
}

/* The teacher's activations and scratch, freed between its forwards on the CPU (on a device freeing
 * would synchronize it every micro-batch: kept there). */
static void release_teacher(train_kind *k) {
    if (ctrl_model_device(k->teacher).type == CTRL_DEVICE_CPU) ctrl_model_release_scratch(k->teacher);
}

/* One micro-batch: the teacher's forward, the student's through the divergence head, backward. */
static ctrl_status micro_batch(train_kind *k, const ctrl_batch *b, double num_items, int source,
                               train_step_stats *out) {
    const int T = b->T;
    float *w = malloc(sizeof(float) * (size_t)T), *d = malloc(sizeof(float) * (size_t)T);
    float *jsd = malloc(sizeof(float) * (size_t)T);
    ctrl_status st = w && d && jsd ? CTRL_OK : ctrl_error_set(CTRL_ERR_NOMEM, "train: out of memory");
    for (int t = 0; st == CTRL_OK && t < T; t++) w[t] = b->targets[t] >= 0 ? 1.0f : 0.0f;
    ctrl_distill_batch db = {.size = sizeof db,
                             .T = T,
                             .weight = w,
                             .num_items = num_items,
                             .source = source,
                             .report = report,
                             .report_ctx = k};
    double loss = 0;
    if (st == CTRL_OK) st = k->ops->distill_loss(k->trainer, &db, &loss, d); /* dL/djsd, up front */
    const double t0 = ctrl_now();
    if (st == CTRL_OK) st = ctrl_model_hidden_forward(k->teacher, b);
    const double t1 = ctrl_now();
    const ctrl_jsd_args a = {.beta = k->spec.beta, .temperature = k->spec.loss_temperature, .weight = d};
    if (st == CTRL_OK) st = ctrl_model_jsd_forward(k->model, b, k->teacher, &a, jsd);
    release_teacher(k); /* not held through the student's backward and optimizer step */
    db.jsd = jsd;
    if (st == CTRL_OK) st = k->ops->distill_loss(k->trainer, &db, &loss, d);
    if (st == CTRL_OK) st = ctrl_model_backward(k->model, NULL);
    report(k, "timing/teacher_s", t1 - t0);
    report(k, "timing/train_s", ctrl_now() - t1);
    out->loss += loss;
    free(w), free(d), free(jsd);
    return st;
}

static ctrl_status distill_accumulate(train_kind *k, const int *order, long *cursor, int bs, int ga,
                                      train_step_stats *out) {
    ctrl_batch *mb = calloc((size_t)ga, sizeof *mb);
    int *idx = malloc(sizeof(int) * (size_t)bs * ga);
    if (!mb || !idx) {
        free(mb), free(idx);
        return ctrl_error_set(CTRL_ERR_NOMEM, "train: out of memory");
    }
    const long first = *cursor;
    long num_items = 0, real_tokens = 0;
    ctrl_status st = CTRL_OK;
    for (int g = 0; g < ga && st == CTRL_OK; g++) {
        for (int i = 0; i < bs; i++) idx[g * bs + i] = order[(*cursor)++ % k->train.n];
        const long trained = ctrl_batch_build(&k->train, idx + g * bs, bs, &mb[g], &real_tokens);
        if (trained < 0) st = CTRL_ERR_NOMEM;
        num_items += trained; /* the dataset's labels, as the HF Trainer counts them */
    }
    const double items = st == CTRL_OK ? train_dp_items(num_items) : 0;
    /* over N ranks micro-batch g is the g-th of one process running N x bs rows (data_parallel.c
     * hands rank r rows [(g N + r) bs, (g N + r + 1) bs) of the step): the same draw and sample seeds */
    const int N = ctrl_collective_size(), rank = ctrl_collective_rank();
    for (int g = 0; g < ga && st == CTRL_OK; g++) {
        /* TRL: random.random() <= lmbda -> the student's completions; elif seq_kd -> the teacher's */
        const uint64_t draw = (uint64_t)(first + (long)g * bs * N);
        const int source = uniform(k->seed, draw) <= k->spec.lmbda ? 1 : k->spec.seq_kd ? 2 : 0;
        if (source) {
            const double t0 = ctrl_now();
            ctrl_batch_free(&mb[g]);
            st = sample_batch(k, source == 1 ? k->engine : k->teacher_engine, idx + g * bs, bs, draw,
                              rank * bs, &mb[g]);
            report(k, "timing/generation_s", ctrl_now() - t0);
        }
        report(k, "on_policy", source == 1);
        if (st == CTRL_OK) {
            long tokens = 0;
            for (int s = 0; s < mb[g].B; s++) tokens += mb[g].cu_seqlens[s + 1] - mb[g].cu_seqlens[s];
            out->tokens += source ? tokens : 0;
            st = micro_batch(k, &mb[g], items, source, out);
        }
        if (source) { /* sample_batch's one allocation */
            free((void *)mb[g].tokens);
            memset(&mb[g], 0, sizeof mb[g]);
        }
    }
    out->tokens += real_tokens; /* the dataset rows' (what TRL's num_tokens would count before) */
    for (int g = 0; g < ga; g++) ctrl_batch_free(&mb[g]);
    free(mb), free(idx);
    out->trained = num_items;
    if (st == CTRL_OK)
        st = train_zero_ref_report(k->teacher_zero, "the teacher"); /* the first step's, once */
    return st;
}

static void distill_log_window(train_kind *k, const train_window *w, FILE *f) {
    fprintf(f, "\"loss\": %.6g, \"grad_norm\": %.6f, \"learning_rate\": %.6g, ", w->loss, w->grad_norm,
            w->learning_rate);
    for (int i = 0; i < k->n_metrics; i++)
        if (k->mcount[i]) fprintf(f, "\"%s\": %.6g, ", k->mname[i], k->msum[i] / k->mcount[i]);
    k->n_metrics = 0;
    if (!isatty(fileno(stderr)))
        fprintf(stderr, "step %ld/%ld  loss %.4g  grad_norm %.3f  lr %.3g  %.0f tok/s\n", w->step, w->total,
                w->loss, w->grad_norm, w->learning_rate, w->tokens_per_second);
}

/* Exact match (every completion token the argmax given the true prefix: greedy decoding reproduces
 * the completion) and token accuracy of `m` over batch b; counts[0..3] += exact, sequences,
 * correct, tokens. */
static ctrl_status count_matches(ctrl_model *m, const ctrl_batch *b, double *counts) {
    float *lp = malloc(sizeof(float) * (size_t)b->T);
    int32_t *ok = malloc(sizeof(int32_t) * (size_t)b->T);
    ctrl_status st = lp && ok ? ctrl_model_forward(m, b, lp, NULL, ok)
                              : ctrl_error_set(CTRL_ERR_NOMEM, "eval: out of memory");
    for (int s = 0; st == CTRL_OK && s < b->B; s++) {
        int all = 1, any = 0;
        for (int t = b->cu_seqlens[s]; t < b->cu_seqlens[s + 1]; t++) {
            if (b->targets[t] < 0) continue;
            counts[2] += ok[t] != 0, counts[3] += 1, all &= ok[t] != 0, any = 1;
        }
        counts[0] += any && all, counts[1] += any;
    }
    free(lp), free(ok);
    return st;
}

/* TRL's eval_loss (the divergence on the eval set's completions, batchmean per batch, averaged over
 * the examples), and the student's teacher-forced exact match and token accuracy; the teacher's
 * exact match once, for comparison. */
static ctrl_status distill_evaluate(train_kind *k, long step, FILE *f) {
    const ctrl_dataset *d = &k->eval;
    const int bs = k->eval_bs;
    double loss_sum = 0, counts[4] = {0}, tcounts[4] = {0}, batches = 0;
    int *idx = malloc(sizeof(int) * (size_t)bs);
    ctrl_status st = idx ? CTRL_OK : ctrl_error_set(CTRL_ERR_NOMEM, "eval: out of memory");
    const int teacher_too = isnan(k->teacher_exact);
    const long n_batches = (d->n + bs - 1) / bs;
    for (long e = 0; e < train_dp_eval_span(n_batches) && st == CTRL_OK; e++) {
        if (!train_dp_eval_mine(e)) continue; /* another rank's batch (data_parallel.h) */
        int pad; /* zero3's lockstep: a padding batch, its values dropped (into scratch counts) */
        const int i0 = (int)train_dp_eval_batch(e, n_batches, &pad) * bs;
        double scratch[2][4] = {{0}};
        batches += !pad;
        const int n = i0 + bs <= d->n ? bs : d->n - i0;
        for (int i = 0; i < n; i++) idx[i] = i0 + i;
        ctrl_batch b;
        const long trained = ctrl_batch_build(d, idx, n, &b, NULL);
        if (trained < 0) {
            st = CTRL_ERR_NOMEM;
            break;
        }
        float *jsd = malloc(sizeof(float) * (size_t)b.T);
        const ctrl_jsd_args a = {.beta = k->spec.beta, .temperature = k->spec.loss_temperature};
        st = jsd ? ctrl_model_hidden_forward(k->teacher, &b)
                 : ctrl_error_set(CTRL_ERR_NOMEM, "eval: out of memory");
        if (st == CTRL_OK) st = ctrl_model_jsd_forward(k->model, &b, k->teacher, &a, jsd);
        double sum = 0;
        for (int t = 0; st == CTRL_OK && t < b.T; t++) sum += jsd[t];
        if (!pad) loss_sum += n * (sum / (trained > 1 ? trained : 1));
        if (st == CTRL_OK) st = count_matches(k->model, &b, pad ? scratch[0] : counts);
        if (st == CTRL_OK && teacher_too) st = count_matches(k->teacher, &b, pad ? scratch[1] : tcounts);
        free(jsd);
        ctrl_batch_free(&b);
    }
    free(idx);
    release_teacher(k);
    /* every rank's batches' sums: the whole set's means, as one process makes them */
    const long mine = (long)batches;
    double v[10] = {loss_sum,   counts[0],  counts[1],  counts[2],  counts[3],
                    tcounts[0], tcounts[1], tcounts[2], tcounts[3], batches};
    if ((st = train_dp_eval_reduce(st, v, 10)) != CTRL_OK) return st;
    loss_sum = v[0];
    for (int i = 0; i < 4; i++) counts[i] = v[1 + i], tcounts[i] = v[5 + i];
    if (teacher_too) k->teacher_exact = tcounts[1] > 0 ? tcounts[0] / tcounts[1] : 0;
    if (!f) return CTRL_OK; /* rank 0 writes */
    const double loss = d->n ? loss_sum / d->n : 0, exact = counts[1] > 0 ? counts[0] / counts[1] : 0,
                 acc = counts[3] > 0 ? counts[2] / counts[3] : 0;
    fprintf(f,
            "{\"step\": %ld, \"eval_loss\": %.6f, \"eval_mean_token_accuracy\": %.6f, \"eval_exact_match\": "
            "%.6f, "
            "\"eval_teacher_exact_match\": %.6f}\n",
            step, loss, acc, exact, k->teacher_exact);
    fflush(f);
    char note[128];
    train_dp_eval_note(note, sizeof note, mine, (long)v[9]);
    CTRL_INFO("eval: divergence %.4f, token accuracy %.3f, exact match %.3f (teacher %.3f; %d examples%s)",
              loss, acc, exact, k->teacher_exact, d->n, note);
    return CTRL_OK;
}

static int distill_has_eval(const train_kind *k) { return k->eval.n > 0; }

/* zero3: the sliced teacher gathered whole on every rank around an evaluation, as the student */
static ctrl_status distill_eval_whole(train_kind *k, int on) {
    return train_zero_ref_whole(k->teacher_zero, on);
}

const train_kind_ops train_kind_distill = {
    .name = "distill",
    .create = distill_create,
    .destroy = distill_destroy,
    .row_count = distill_rows,
    .rows_per_step = distill_rows_per_step,
    .describe = distill_describe,
    .accumulate = distill_accumulate,
    .after_step = distill_after_step,
    .log_window = distill_log_window,
    .has_eval = distill_has_eval,
    .evaluate = distill_evaluate,
    .eval_whole = distill_eval_whole,
    .eval_at_start = 1,
    .eval_layerwise = 1,
};
