/* The training loop the core owns (DESIGN §7): steps and epochs, micro-batches and gradient
 * accumulation with the loss normalised over the trained tokens of the whole accumulated batch,
 * learning-rate schedule, global-norm clipping, the optimizer plugin, metrics with TRL's names,
 * evaluation, and saving. The trainer plugin turns log-probabilities into the loss. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <ctrl/memory.h>
#include <ctrl/optimizer.h>
#include <ctrl/trainer.h>

#include "cpu/cpu_ops.h"
#include "file_text.h"
#include "train/checkpoint.h"
#include "train/metrics_plot.h"
#include "train/online.h"
#include "device/cuda_backend.h"
#include "train/train.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* A permutation of 0..n-1, shuffled with a seeded generator (Fisher-Yates). */
static void shuffled(int *order, int n, uint64_t seed, int shuffle) {
    for (int i = 0; i < n; i++) order[i] = i;
    if (!shuffle) return;
    uint64_t s = seed * 6364136223846793005ull + 1442695040888963407ull;
    for (int i = n - 1; i > 0; i--) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        int j = (int)((s >> 33) % (uint64_t)(i + 1));
        int t = order[i];
        order[i] = order[j], order[j] = t;
    }
}

/* The model where the run computes: the host model, or its copy on a CUDA device (`[run] device`),
 * whose gradients come back to the host buffer for clipping and the optimizer, and whose
 * parameters are refreshed from the host after each optimizer step. */
typedef struct compute {
    ctrl_model *host;
    const ctrl_cuda_backend *cuda;
    ctrl_model_cuda *dev;
} compute;

static ctrl_status compute_forward(const compute *c, const ctrl_batch *b, float *lp, float *ent,
                                   int32_t *ok) {
    return c->dev ? c->cuda->forward(c->dev, b, lp, ent, ok) : ctrl_model_forward(c->host, b, lp, ent, ok);
}
static ctrl_status compute_backward(const compute *c, const float *dlogp) {
    return c->dev ? c->cuda->backward(c->dev, dlogp) : ctrl_model_backward(c->host, dlogp);
}
static ctrl_status compute_zero_grad(const compute *c) {
    ctrl_model_zero_grad(c->host);
    return c->dev ? c->cuda->zero_grad(c->dev) : CTRL_OK;
}
/* After the micro-batches: the gradients in the host buffer. */
static ctrl_status compute_gather_grads(const compute *c) {
    return c->dev ? c->cuda->grads_to_host(c->dev, ctrl_model_grads(c->host, NULL)) : CTRL_OK;
}
/* After the optimizer step on the host parameters. */
static ctrl_status compute_sync_params(const compute *c) {
    return c->dev ? c->cuda->params_from_host(c->dev) : CTRL_OK;
}

typedef struct eval_result {
    double loss, accuracy, exact_match;
} eval_result;

/* Teacher-forced evaluation. Exact match under greedy decoding equals "every trained token is the
 * argmax given the true prefix" (by induction over the completion), so it needs no generation; it
 * is counted per sequence (a packed row holds several), over sequences with a trained token. */
static ctrl_status evaluate(const compute *m, const ctrl_dataset *d, int bs, eval_result *r) {
    double nll = 0;
    long tokens = 0, correct = 0, exact = 0, sequences = 0;
    int *idx = malloc(sizeof(int) * (size_t)bs);
    ctrl_status st = CTRL_OK;
    for (int i0 = 0; i0 < d->n && st == CTRL_OK; i0 += bs) {
        int n = i0 + bs <= d->n ? bs : d->n - i0;
        for (int k = 0; k < n; k++) idx[k] = i0 + k;
        ctrl_batch b;
        ctrl_batch_build(d, idx, n, &b, NULL);
        float *lp = malloc(sizeof(float) * (size_t)b.T);
        int32_t *ok = malloc(sizeof(int32_t) * (size_t)b.T);
        st = compute_forward(m, &b, lp, NULL, ok);
        for (int k = 0; st == CTRL_OK && k < b.B; k++) {
            int all = 1, any = 0;
            for (int t = b.cu_seqlens[k]; t < b.cu_seqlens[k + 1]; t++) {
                if (b.targets[t] < 0) continue;
                nll -= lp[t], tokens++, correct += ok[t];
                all &= ok[t], any = 1;
            }
            exact += any && all, sequences += any;
        }
        free(lp), free(ok);
        ctrl_batch_free(&b);
    }
    free(idx);
    r->loss = tokens ? nll / tokens : 0;
    r->accuracy = tokens ? (double)correct / tokens : 0;
    r->exact_match = sequences ? (double)exact / sequences : 0;
    return st;
}

typedef struct run_state {
    const ctrl_config *cfg;
    ctrl_model *model;
    ctrl_tokenizer *tok;
    ctrl_dataset train, eval;
    const ctrl_trainer_ops *trainer_ops;
    ctrl_trainer *trainer;
    const ctrl_optimizer_ops *opt_ops;
    ctrl_optimizer *opt;
    const ctrl_memory_ops *mem_ops;
    ctrl_memory *mem;
    ctrl_param_group *groups;
    int n_groups;
    FILE *metrics;
    ctrl_online *online; /* online trainers (grpo, rloo, ...): prompts, generation, rewards */
    compute comp;
} run_state;

/* `[train] dtype`: bf16 runs the CPU model's linear projections in bf16 (fp32 accumulation, fp32
 * master weights, as torch.autocast); fp32 runs everything in fp32. The CUDA model computes in fp32
 * so far. */
static ctrl_status apply_compute_dtype(run_state *r) {
    const char *dtype = ctrl_config_get_string(r->cfg, "train", "dtype");
    if (r->comp.cuda) {
        if (strcmp(dtype, "fp32") != 0)
            CTRL_WARN("[train] dtype = %s: the CUDA model computes in fp32 so far", dtype);
        return CTRL_OK;
    }
    if (strcmp(dtype, "fp16") == 0)
        return ctrl_error_set(CTRL_ERR_CONFIG,
                              "[train] dtype = fp16: not supported on the CPU (use bf16 or fp32)");
    return ctrl_model_set_compute_dtype(r->model, strcmp(dtype, "bf16") == 0 ? CTRL_BF16 : CTRL_F32);
}

/* What the loop iterates over: SFT examples, or an online trainer's prompts. */
static int row_count(const run_state *r) {
    return r->online ? ctrl_online_prompt_count(r->online) : r->train.n;
}

/* The [memory] strategy, attached to the model (one at a time so far). */
static ctrl_status attach_memory(run_state *r, const ctrl_registry *reg) {
    const int n = ctrl_config_list_count(r->cfg, "memory", "strategies");
    if (n == 0) return CTRL_OK;
    char name[128];
    ctrl_config_list_item(r->cfg, "memory", "strategies", 0, name, sizeof name);
    if (n > 1)
        return ctrl_error_set(CTRL_ERR_UNSUPPORTED,
                              "[memory] strategies: one strategy at a time so far (got %d)", n);
    const ctrl_plugin_entry *e = ctrl_registry_find(reg, CTRL_KIND_MEMORY, name);
    if (!e) return ctrl_error_set(CTRL_ERR_PLUGIN, "[memory] strategies: '%s' is not loaded", name);
    r->mem_ops = e->plugin->ops;
    ctrl_status st =
        r->mem_ops->create(ctrl_host_table(), r->cfg, ctrl_model_cfg(r->model)->n_layers, &r->mem);
    if (st == CTRL_OK) ctrl_model_set_memory(r->model, r->mem_ops, r->mem);
    return st;
}

/* Loads plugins, model (its weights from `weights_dir` when resuming), tokenizer, data, optimizer. */
static ctrl_status setup(run_state *r, const ctrl_registry *reg, const char *weights_dir) {
    const ctrl_config *cfg = r->cfg;
    const ctrl_host *host = ctrl_host_table();
    const char *trainer = ctrl_config_get_string(cfg, "run", "trainer");
    const char *attention = ctrl_config_get_string(cfg, "model", "attention");
    const char *optimizer = ctrl_config_get_string(cfg, "train", "optimizer");
    const char *model_path = ctrl_config_get_string(cfg, "model", "path");
    ctrl_device dev;
    ctrl_status dst = ctrl_device_select(ctrl_config_get_string(cfg, "run", "device"), &dev, &r->comp.cuda);
    if (dst != CTRL_OK) return dst;
    const ctrl_plugin_entry *te = ctrl_registry_find(reg, CTRL_KIND_TRAINER, trainer);
    const ctrl_plugin_entry *ae = ctrl_registry_find(reg, CTRL_KIND_ATTENTION, attention);
    const ctrl_plugin_entry *oe = ctrl_registry_find(reg, CTRL_KIND_OPTIMIZER, optimizer);
    if (!te || !ae || !oe) return ctrl_error_set(CTRL_ERR_PLUGIN, "train: a selected plugin is not loaded");
    r->trainer_ops = te->plugin->ops;
    if (!r->trainer_ops->loss)
        return ctrl_error_set(CTRL_ERR_UNSUPPORTED,
                              "trainer '%s' has no token-level loss the core loop can run", trainer);
    ctrl_status st = r->trainer_ops->create(host, cfg, &r->trainer);
    if (st == CTRL_OK)
        st = ctrl_model_load(weights_dir ? weights_dir : model_path, ae->plugin->ops, &r->model);
    r->comp.host = r->model;
    if (st == CTRL_OK) st = apply_compute_dtype(r);
    if (st == CTRL_OK && r->comp.cuda) { /* fp32 on the device, the optimizer on the host (for now) */
        if (r->trainer_ops->size >= sizeof(ctrl_trainer_ops) && r->trainer_ops->advantages)
            return ctrl_error_set(CTRL_ERR_UNSUPPORTED,
                                  "[run] trainer = %s: online trainers run on the CPU so far "
                                  "(set [run] device = cpu)",
                                  trainer);
        st = r->comp.cuda->model_create(r->model, ae->plugin->ops, &r->comp.dev);
        if (st == CTRL_OK && ctrl_config_list_count(cfg, "memory", "strategies") > 0)
            CTRL_WARN(
                "[memory] strategies: not applied on CUDA yet (every activation is kept on the device)");
    }
    if (st == CTRL_OK && !r->comp.dev) st = attach_memory(r, reg);
    if (st == CTRL_OK) st = ctrl_tokenizer_load(model_path, &r->tok);
    if (st == CTRL_OK && r->trainer_ops->size >= sizeof(ctrl_trainer_ops) && r->trainer_ops->advantages)
        st = ctrl_online_create(cfg, reg, r->model, r->tok, r->trainer_ops, r->trainer, &r->online);
    else if (st == CTRL_OK)
        st = ctrl_datasets_load(cfg, r->tok, &r->train, &r->eval);
    if (st != CTRL_OK) return st;
    /* One parameter group per tensor: norms and biases get no weight decay (as the HF Trainer). */
    const double wd = ctrl_config_get_float(cfg, "train", "weight_decay", 0);
    r->n_groups = ctrl_model_view_count(r->model);
    r->groups = calloc((size_t)r->n_groups, sizeof *r->groups);
    float *params = ctrl_model_params(r->model, NULL), *grads = ctrl_model_grads(r->model, NULL);
    for (int i = 0; i < r->n_groups; i++) {
        const ctrl_param_view *v = ctrl_model_view(r->model, i);
        r->groups[i] = (ctrl_param_group){.param = params + v->offset,
                                          .grad = grads + v->offset,
                                          .numel = v->numel,
                                          .weight_decay = v->no_decay ? 0.0f : (float)wd};
    }
    r->opt_ops = oe->plugin->ops;
    return r->opt_ops->create(host, cfg, r->groups, r->n_groups, (ctrl_device){CTRL_DEVICE_CPU, 0}, &r->opt);
}

static void teardown(run_state *r) {
    ctrl_online_free(r->online);
    if (r->comp.dev) r->comp.cuda->model_free(r->comp.dev);
    if (r->opt) r->opt_ops->destroy(r->opt);
    if (r->trainer) r->trainer_ops->destroy(r->trainer);
    if (r->mem) r->mem_ops->destroy(r->mem);
    ctrl_dataset_free(&r->train);
    ctrl_dataset_free(&r->eval);
    ctrl_tokenizer_free(r->tok);
    ctrl_model_free(r->model);
    free(r->groups);
    if (r->metrics) fclose(r->metrics);
}

/* One optimizer step over `ga` micro-batches of `bs` examples taken from order[*cursor...]. */
typedef struct step_stats {
    double loss, grad_norm, accuracy, entropy;
    long tokens, trained;
} step_stats;

static ctrl_status finish_step(run_state *r, double lr, long step, step_stats *out);

static ctrl_status train_step(run_state *r, const int *order, long *cursor, int bs, int ga, double lr,
                              long step, step_stats *out) {
    memset(out, 0, sizeof *out);
    ctrl_status zst = compute_zero_grad(&r->comp);
    if (zst != CTRL_OK) return zst;
    if (r->online) {
        ctrl_status st = ctrl_online_accumulate(r->online, order, cursor, bs, ga, &out->loss, &out->tokens);
        if (st == CTRL_OK) st = finish_step(r, lr, step, out);
        return st == CTRL_OK ? ctrl_online_after_step(r->online) : st;
    }
    ctrl_batch *mb = calloc((size_t)ga, sizeof *mb);
    long num_items = 0, real_tokens = 0;
    int *idx = malloc(sizeof(int) * (size_t)bs);
    for (int g = 0; g < ga; g++) {
        for (int k = 0; k < bs; k++) idx[k] = order[(*cursor)++ % r->train.n];
        num_items += ctrl_batch_build(&r->train, idx, bs, &mb[g], &real_tokens);
        out->tokens += real_tokens; /* num_tokens counts what is not padding, as TRL */
    }
    free(idx);
    ctrl_status st = CTRL_OK;
    for (int g = 0; g < ga && st == CTRL_OK; g++) {
        const int T = mb[g].T;
        float *lp = malloc(sizeof(float) * (size_t)T), *w = malloc(sizeof(float) * (size_t)T);
        float *dlp = malloc(sizeof(float) * (size_t)T), *ent = malloc(sizeof(float) * (size_t)T);
        int32_t *ok = malloc(sizeof(int32_t) * (size_t)T);
        ctrl_trainer_batch tb = {
            .size = sizeof tb, .T = T, .logp = lp, .weight = w, .num_items = (double)num_items};
        for (int t = 0; t < T; t++) w[t] = mb[g].targets[t] >= 0 ? 1.0f : 0.0f;
        double loss;
        /* a loss linear in the log-probs (SFT): dL/dlogp first, and the head's backward fused
         * into the forward (on the CPU model) */
        const int fused = !r->comp.dev && r->trainer_ops->size >= sizeof(ctrl_trainer_ops) &&
                          r->trainer_ops->dlogp_before_forward;
        if (fused) {
            memset(lp, 0, sizeof(float) * (size_t)T);
            st = r->trainer_ops->loss(r->trainer, &tb, &loss, dlp);
            if (st == CTRL_OK) st = ctrl_model_forward_fused(r->comp.host, &mb[g], dlp, lp, ent, ok);
        } else {
            st = compute_forward(&r->comp, &mb[g], lp, ent, ok);
        }
        if (st == CTRL_OK) {
            /* entropy and token accuracy over the trained tokens of each micro-batch, then averaged
             * over the micro-batches, as TRL's SFTTrainer logs them */
            long valid = 0, correct = 0;
            double ent_sum = 0;
            for (int t = 0; t < T; t++)
                if (w[t] > 0) valid++, correct += ok[t] != 0, ent_sum += ent[t];
            out->accuracy += valid ? (double)correct / valid / ga : 0;
            out->entropy += valid ? ent_sum / valid / ga : 0;
            st = r->trainer_ops->loss(r->trainer, &tb, &loss, dlp);
            if (st == CTRL_OK) out->loss += loss, st = compute_backward(&r->comp, fused ? NULL : dlp);
        }
        free(lp), free(w), free(dlp), free(ent), free(ok);
    }
    for (int g = 0; g < ga; g++) ctrl_batch_free(&mb[g]);
    free(mb);
    if (st != CTRL_OK) return st;
    out->trained = num_items;
    return finish_step(r, lr, step, out);
}

/* The gradients of the step are accumulated: their norm, clipping, the optimizer. */
static ctrl_status finish_step(run_state *r, double lr, long step, step_stats *out) {
    ctrl_status gst = compute_gather_grads(&r->comp);
    if (gst != CTRL_OK) return gst;
    size_t n;
    float *grads = ctrl_model_grads(r->model, &n);
    out->grad_norm = sqrt(ctrl_cpu_sum_squares(grads, (int64_t)n));
    if (!isfinite(out->loss) || !isfinite(out->grad_norm))
        return ctrl_error_set(CTRL_ERR_RUNTIME,
                              "step %ld: non-finite %s (%g); stopping, nothing of this step is saved",
                              step + 1, isfinite(out->loss) ? "grad_norm" : "loss",
                              isfinite(out->loss) ? out->grad_norm : out->loss);
    /* torch.nn.utils.clip_grad_norm_: scale by max_norm / (norm + 1e-6) when that is below 1. */
    const double max_norm = ctrl_config_get_float(r->cfg, "train", "max_grad_norm", 1.0);
    if (max_norm > 0) {
        double coef = max_norm / (out->grad_norm + 1e-6);
        if (coef < 1) ctrl_cpu_scale(grads, (float)coef, (int64_t)n);
    }
    ctrl_status st = r->opt_ops->step(r->opt, r->groups, r->n_groups, lr, step + 1);
    ctrl_model_weights_changed(r->model);
    return st == CTRL_OK ? compute_sync_params(&r->comp) : st;
}

static void progress(long step, long total, double rate, double eta, double loss) {
    if (isatty(fileno(stderr))) {
        int width = 30, done = (int)(width * step / (total ? total : 1));
        fprintf(stderr, "\r[%.*s%*s] %ld/%ld  %.0f tok/s  ETA %.0fs  loss %.4f ", done,
                "##############################", width - done, "", step, total, rate, eta, loss);
        if (step == total) fputc('\n', stderr);
    }
}

/* metrics.jsonl: new, or on resume the lines up to the checkpoint's step kept (a killed run may
 * have logged past it) and appended to. */
static ctrl_status open_metrics(run_state *r, const char *out_dir, long resume_step) {
    char path[4200];
    snprintf(path, sizeof path, "%s/metrics.jsonl", out_dir);
    if (resume_step > 0) { /* rewritten beside and renamed: a kill here loses no line */
        ctrl_status st;
        char tmp[4300], *old = ctrl_read_text_file(path, 1u << 30, &st), *save;
        snprintf(tmp, sizeof tmp, "%s.tmp", path);
        FILE *f = fopen(tmp, "w");
        for (char *line = old ? strtok_r(old, "\n", &save) : NULL; f && line;
             line = strtok_r(NULL, "\n", &save)) {
            const char *k = strstr(line, "\"step\": ");
            if (k && atol(k + 8) <= resume_step) fprintf(f, "%s\n", line);
        }
        free(old);
        if (!f || fclose(f) != 0 || rename(tmp, path) != 0)
            return ctrl_error_set(CTRL_ERR_IO, "%s: cannot rewrite it: %s", path, strerror(errno));
    }
    if (!(r->metrics = fopen(path, resume_step > 0 ? "a" : "w")))
        return ctrl_error_set(CTRL_ERR_IO, "%s: %s", path, strerror(errno));
    return CTRL_OK;
}

static ctrl_status run_eval(run_state *r, int bs, long step) {
    if (r->online) return ctrl_online_evaluate(r->online, step, r->metrics);
    eval_result e;
    ctrl_status st = evaluate(&r->comp, &r->eval, bs, &e);
    if (st != CTRL_OK) return st;
    fprintf(r->metrics, "{\"step\": %ld, ", step);
    fprintf(r->metrics,
            "\"eval_loss\": %.6f, \"eval_mean_token_accuracy\": %.6f, \"eval_exact_match\": %.6f}\n", e.loss,
            e.accuracy, e.exact_match);
    fflush(r->metrics);
    CTRL_INFO("eval: loss %.4f, token accuracy %.3f, exact match %.3f (%d examples)", e.loss, e.accuracy,
              e.exact_match, r->eval.n);
    return CTRL_OK;
}

static void log_window(run_state *r, ctrl_train_state *ts, long total, double lr, double rate) {
    const double n = ts->win;
    if (r->online) { /* TRL's online metrics come from the trainer and the generation batches */
        fprintf(r->metrics, "{\"step\": %ld, \"loss\": %.6g, \"grad_norm\": %.6f, \"learning_rate\": %.6g, ",
                ts->step, ts->win_loss / n, ts->win_norm / n, lr);
        ctrl_online_log_window(r->online, r->metrics);
        fprintf(r->metrics, "\"num_tokens\": %ld, \"epoch\": %.4f, \"tokens_per_second\": %.1f}\n",
                ts->num_tokens, (double)ts->cursor / row_count(r), rate);
        fflush(r->metrics);
        if (!isatty(fileno(stderr)))
            fprintf(stderr, "step %ld/%ld  loss %.4g  grad_norm %.3f  lr %.3g  %.0f tok/s\n", ts->step, total,
                    ts->win_loss / n, ts->win_norm / n, lr, rate);
        ts->win_loss = ts->win_acc = ts->win_norm = ts->win_ent = 0, ts->win = 0;
        return;
    }
    fprintf(
        r->metrics,
        "{\"step\": %ld, \"loss\": %.6f, \"grad_norm\": %.6f, \"learning_rate\": %.6g, \"entropy\": %.6f, "
        "\"mean_token_accuracy\": %.6f, \"num_tokens\": %ld, \"epoch\": %.4f, \"tokens_per_second\": %.1f}\n",
        ts->step, ts->win_loss / n, ts->win_norm / n, lr, ts->win_ent / n, ts->win_acc / n, ts->num_tokens,
        (double)ts->cursor / r->train.n, rate);
    fflush(r->metrics);
    if (!isatty(fileno(stderr)))
        fprintf(stderr, "step %ld/%ld  loss %.4f  grad_norm %.3f  lr %.3g  acc %.3f  %.0f tok/s\n", ts->step,
                total, ts->win_loss / n, ts->win_norm / n, lr, ts->win_acc / n, rate);
    ts->win_loss = ts->win_acc = ts->win_norm = ts->win_ent = 0, ts->win = 0;
}

static ctrl_status save_checkpoint(run_state *r, const char *out_dir, const ctrl_train_state *ts) {
    char dir[4200];
    const int keep = (int)ctrl_config_get_int(r->cfg, "train", "save_total_limit", 0);
    ctrl_status st = ctrl_checkpoint_save(out_dir, r->model, ctrl_config_get_string(r->cfg, "model", "path"),
                                          r->opt_ops, r->opt, ts, keep, dir, sizeof dir);
    if (st == CTRL_OK) CTRL_INFO("checkpoint saved to %s", dir);
    return st;
}

ctrl_status ctrl_train_run(const ctrl_config *cfg, const ctrl_registry *reg, int (*interrupted)(void)) {
    run_state r = {.cfg = cfg};
    const char *out_dir = ctrl_config_get_string(cfg, "run", "output_dir");
    const char *resume = ctrl_config_get_string(cfg, "train", "resume_from_checkpoint");
    char ckpt[4200] = "";
    ctrl_status st = resume ? ctrl_checkpoint_resolve(out_dir, resume, ckpt, sizeof ckpt) : CTRL_OK;
    if (st == CTRL_OK) st = setup(&r, reg, ckpt[0] ? ckpt : NULL);
    const uint64_t seed = (uint64_t)ctrl_config_get_int(cfg, "run", "seed", 42);
    ctrl_train_state ts = {.seed = seed};
    snprintf(ts.optimizer, sizeof ts.optimizer, "%s", ctrl_config_get_string(cfg, "train", "optimizer"));
    if (st == CTRL_OK && ckpt[0]) {
        st = ctrl_checkpoint_load_state(ckpt, ctrl_config_get_string(cfg, "train", "optimizer"), r.opt_ops,
                                        r.opt, &ts);
        if (st == CTRL_OK && ts.seed != seed)
            CTRL_WARN("resuming with [run] seed = %llu; the checkpoint was made with seed %llu",
                      (unsigned long long)seed, (unsigned long long)ts.seed),
                ts.seed = seed;
        if (st == CTRL_OK && ts.n_examples != row_count(&r))
            CTRL_WARN("the checkpoint was made on %ld training examples, this run has %d: the data order "
                      "differs from the interrupted run's",
                      ts.n_examples, row_count(&r));
        if (st == CTRL_OK) CTRL_INFO("resuming from %s at step %ld", ckpt, ts.step);
    }
    if (st == CTRL_OK) st = open_metrics(&r, out_dir, ts.step);
    if (st != CTRL_OK) {
        teardown(&r);
        return st;
    }
    const int bs = (int)ctrl_config_get_int(cfg, "train", "per_device_train_batch_size", 8);
    const int ga = (int)ctrl_config_get_int(cfg, "train", "gradient_accumulation_steps", 1);
    const int n_rows = row_count(&r);
    /* an online step consumes bs x ga completions: bs x ga / (num_generations x num_iterations) prompts */
    long rows_per_step = (long)bs * ga;
    if (r.online) {
        ctrl_online_spec spec = {.size = sizeof spec};
        r.trainer_ops->online_spec(r.trainer, &spec);
        rows_per_step = rows_per_step / ((long)spec.num_generations * spec.num_iterations);
        if (rows_per_step < 1) rows_per_step = 1;
    }
    const long per_epoch = (n_rows + rows_per_step - 1) / rows_per_step;
    long total = ctrl_config_get_int(cfg, "train", "max_steps", -1);
    if (total <= 0)
        total = (long)ceil(ctrl_config_get_float(cfg, "train", "num_train_epochs", 3) * per_epoch);
    ts.n_examples = n_rows, ts.max_steps = total;
    long warmup = ctrl_config_get_int(cfg, "train", "warmup_steps", 0);
    if (warmup <= 0) warmup = (long)ceil(ctrl_config_get_float(cfg, "train", "warmup_ratio", 0) * total);
    const double lr0 = ctrl_config_get_float(cfg, "train", "learning_rate", 2e-5);
    const double min_lr = ctrl_config_get_float(cfg, "train", "min_lr_rate", 0);
    const char *sched = ctrl_config_get_string(cfg, "train", "lr_scheduler_type");
    const long log_every = ctrl_config_get_int(cfg, "train", "logging_steps", 10);
    const long save_every = ctrl_config_get_int(cfg, "train", "save_steps", 500);
    const char *save_strategy = ctrl_config_get_string(cfg, "train", "save_strategy");
    const int saving = !save_strategy || strcmp(save_strategy, "no") != 0;
    const int eval_bs = (int)ctrl_config_get_int(cfg, "train", "per_device_eval_batch_size", 8);
    const long eval_every = ctrl_config_get_int(cfg, "train", "eval_steps", 0);
    const int shuffle = ctrl_config_get_bool(cfg, "data", "shuffle", true);
    size_t n_params;
    ctrl_model_params(r.model, &n_params);
    if (r.online)
        CTRL_INFO("training: %d prompts, %ld steps of %d x %d completions, %zu parameters", n_rows, total, bs,
                  ga, n_params);
    else
        CTRL_INFO("training: %d examples%s (%ld dropped without a trained token, %ld truncated), %ld steps "
                  "of %d x %d, "
                  "%zu parameters",
                  r.train.n, r.train.packed_from ? " (packed)" : "", r.train.dropped_empty, r.train.truncated,
                  total, bs, ga, n_params);
    int *order = malloc(sizeof(int) * (size_t)n_rows);
    long epoch_seen = -1;
    const long start_step = ts.step, start_tokens = ts.num_tokens;
    const double t_start = now();
    if (st == CTRL_OK && r.online && ts.step == 0)
        st = run_eval(&r, eval_bs, 0); /* the "before" of an RL run */
    while (ts.step < total && st == CTRL_OK) {
        const long step = ts.step, epoch = ts.cursor / n_rows;
        if (epoch != epoch_seen) { /* the order is a function of (seed, epoch): resumable */
            shuffled(order, n_rows, ts.seed + (uint64_t)epoch, shuffle);
            epoch_seen = epoch;
        }
        const double lr = ctrl_lr_at(sched ? sched : "linear", lr0, step, total, warmup, min_lr);
        step_stats s;
        const double t_step = now();
        st = train_step(&r, order, &ts.cursor, bs, ga, lr, step, &s);
        if (r.online) ctrl_online_report(r.online, "step_time", now() - t_step); /* as TRL logs it */
        if (st != CTRL_OK) {
            if (st == CTRL_ERR_RUNTIME) { /* non-finite loss: say what is left to resume from */
                char msg[1024], last[4200];
                snprintf(msg, sizeof msg, "%s", ctrl_error_message());
                if (ctrl_checkpoint_last(out_dir, last, sizeof last))
                    ctrl_error_set(st, "%s; the last good checkpoint, %s, is intact", msg, last);
                else
                    ctrl_error_set(st, "%s; no checkpoint was saved before it", msg);
            }
            break;
        }
        ts.step++, ts.num_tokens += s.tokens;
        ts.win_loss += s.loss, ts.win_acc += s.accuracy, ts.win_norm += s.grad_norm, ts.win_ent += s.entropy;
        ts.win++;
        const double elapsed = now() - t_start, rate = (ts.num_tokens - start_tokens) / elapsed;
        progress(ts.step, total, rate, elapsed / (ts.step - start_step) * (total - ts.step), s.loss);
        if (ts.step % log_every == 0 || ts.step == total) log_window(&r, &ts, total, lr, rate);
        if (eval_every > 0 && ts.step % eval_every == 0 && ts.step < total && (r.eval.n || r.online))
            st = run_eval(&r, eval_bs, ts.step);
        /* a checkpoint every save_steps, at the end (as the HF Trainer), and when interrupted */
        const int stop = ts.step < total && interrupted && interrupted();
        if (st == CTRL_OK &&
            (stop || (saving && (ts.step == total || (save_every > 0 && ts.step % save_every == 0)))))
            st = save_checkpoint(&r, out_dir, &ts);
        if (st == CTRL_OK && stop) {
            st = ctrl_error_set(
                CTRL_ERR_INTERRUPTED,
                "interrupted after step %ld: checkpoint and model saved; continue with [train] "
                "resume_from_checkpoint = last",
                ts.step);
            break;
        }
    }
    free(order);
    if (st == CTRL_OK && (r.eval.n || r.online)) st = run_eval(&r, eval_bs, ts.step);
    /* Save on success and on interruption, never after a failed step. */
    if (st == CTRL_OK || st == CTRL_ERR_INTERRUPTED) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", ctrl_error_message());
        ctrl_status s2 = ctrl_model_save(r.model, out_dir, CTRL_F32);
        if (s2 == CTRL_OK)
            s2 = ctrl_copy_tokenizer_files(ctrl_config_get_string(cfg, "model", "path"), out_dir);
        if (s2 != CTRL_OK)
            st = s2;
        else {
            CTRL_INFO("model saved to %s", out_dir);
            if (st != CTRL_OK) ctrl_error_set(st, "%s", msg);
        }
    }
    teardown(&r);
    if (st == CTRL_OK || st == CTRL_ERR_INTERRUPTED) { /* the plot is a convenience: never fails the run */
        char jsonl[4200], png[4200], msg[1024];
        snprintf(msg, sizeof msg, "%s", ctrl_error_message());
        snprintf(jsonl, sizeof jsonl, "%s/metrics.jsonl", out_dir);
        snprintf(png, sizeof png, "%s/metrics.png", out_dir);
        if (ctrl_metrics_plot(jsonl, png) == CTRL_OK)
            CTRL_INFO("curves plotted to %s", png);
        else
            CTRL_WARN("%s", ctrl_error_message());
        if (st != CTRL_OK) ctrl_error_set(st, "%s", msg);
    }
    return st;
}
