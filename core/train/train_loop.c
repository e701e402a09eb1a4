/* The step loop the core owns for every kind of trainer (DESIGN §7): steps and epochs, the
 * learning-rate schedule, the gradient norm and the health check, global-norm clipping, the
 * optimizer plugin, the logging window (metrics.jsonl), the evaluation cadence, checkpoints and
 * interruption. What a step's gradients are made from -- examples, prompts and generations,
 * preference pairs -- is the trainer kind's (kind.h); where they are computed is compute.h's. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <ctrl/memory.h>
#include <ctrl/optimizer.h>
#include <ctrl/trainer.h>

#include "collective/collective.h"
#include "cpu/cpu_ops.h"
#include "file_text.h"
#include "train/checkpoint.h"
#include "train/data_parallel.h"
#include "train/memory_report.h"
#include "train/metrics_log.h"
#include "train/metrics_plot.h"
#include "train/health.h"
#include "train/kind.h"
#include "train/moe_aux.h"
#include "train/train_lora.h"
#include "train/train.h"
#include "train/zero.h"

/* Gives the heap's free pages back to the system (glibc keeps the small blocks a freed structure
 * was made of, e.g. a tokenizer's, in the process otherwise). */
static void train_release_free_memory(void) {
#if defined(__GLIBC__)
    malloc_trim(0);
#endif
}

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

typedef struct run_state {
    const ctrl_config *cfg; /* for the plugins' create() and the kind's data */
    const ctrl_run_settings *s;
    ctrl_model *model;
    ctrl_tokenizer *tok;
    const ctrl_trainer_ops *trainer_ops;
    ctrl_trainer *trainer;
    const ctrl_optimizer_ops *opt_ops;
    ctrl_optimizer *opt;
    ctrl_param_group *groups;
    int n_groups;
    int opt_on_device; /* the optimizer steps the model's device buffers (ctrl_model_device_params) */
    train_metrics_log metrics;
    train_compute comp;
    const train_kind_ops *kind_ops; /* what kind of trainer: its rows, micro-batches, evaluation */
    train_kind *kind;
    train_health health;
    train_dp dp; /* this rank's share of each step (data_parallel.h); root: writes the run's files */
    int root;
    train_zero zero;  /* ZeRO stage 1/2 (zero.h): this rank's slice of the optimizer state */
    train_memory mem; /* the process's memory at the edges of the first step (memory_report.h) */
} run_state;

static void set_groups(run_state *r, float *params, float *grads) {
    r->n_groups = train_param_groups(r->model, params, grads, (float)r->s->train.weight_decay, r->groups);
}

/* [memory] strategies: at most one that hooks the layers (checkpointing), given to the model, at
 * most one ZeRO stage (zero1, zero2, zero3), and offload_optimizer and offload_activations, which
 * the loop carries out (offload: bit 0 the optimizer, bit 1 the activations). */
static ctrl_status memory_strategies(const ctrl_config *cfg, const ctrl_run_plugins *p,
                                     const ctrl_memory_ops **layers, int *zero_stage, int *offload) {
    const char *layer_name = NULL, *zero_name = NULL;
    *layers = NULL, *zero_stage = 0, *offload = 0;
    for (int i = 0; i < p->n_memory; i++) {
        const ctrl_memory_ops *ops = p->memory[i]->ops;
        const char *name = p->memory[i]->name;
        if (ops->size >= offsetof(ctrl_memory_ops, offload_optimizer) + sizeof ops->offload_optimizer &&
            ops->offload_optimizer) {
            *offload |= 1; /* a property of the run, no instance needed beyond the flag */
            continue;
        }
        if (ops->size >= offsetof(ctrl_memory_ops, offload_activations) + sizeof ops->offload_activations &&
            ops->offload_activations) {
            *offload |= 2;
            continue;
        }
        if (ops->size >= offsetof(ctrl_memory_ops, zero_stage) + sizeof ops->zero_stage && ops->zero_stage) {
            if (zero_name)
                return ctrl_error_set(CTRL_ERR_CONFIG,
                                      "[memory] strategies: %s and %s: one ZeRO stage at a time", zero_name,
                                      name);
            ctrl_memory *m = NULL;
            ctrl_status st = ops->create(ctrl_host_table(), cfg, 0, &m);
            if (st != CTRL_OK) return st;
            *zero_stage = ops->zero_stage(m), zero_name = name;
            ops->destroy(m);
            continue;
        }
        if (layer_name)
            return ctrl_error_set(CTRL_ERR_UNSUPPORTED,
                                  "[memory] strategies: %s and %s: one layer strategy at a time so far "
                                  "(a ZeRO stage may go beside it)",
                                  layer_name, name);
        *layers = ops, layer_name = name;
    }
    return CTRL_OK;
}

/* What zero3 runs with so far: the token, sequence and online kinds (generation gathers the whole
 * model around it), not what reads the whole policy at other times. */
static ctrl_status zero3_supported(const run_state *r, const ctrl_sequence_spec *spec) {
    const ctrl_run_settings *s = r->s;
    const train_kind_ops *k = r->kind_ops;
    if (k != &train_kind_token && k != &train_kind_sequence && k != &train_kind_online)
        return ctrl_error_set(CTRL_ERR_UNSUPPORTED,
                              "[memory] strategies = zero3 with trainer = %s: not supported yet (SFT, the "
                              "preference trainers and the online ones are; zero1 and zero2 work with every "
                              "trainer)",
                              s->run.trainer);
    /* on a CUDA model (zero_device.c): the token-level trainers (SFT), fp32, every parameter trained */
    if (r->comp.cuda && k != &train_kind_token)
        return ctrl_error_set(CTRL_ERR_UNSUPPORTED,
                              "[memory] strategies = zero3 with [run] device = cuda and trainer = %s: not "
                              "supported yet (SFT is; zero1 and zero2 on cuda work with every trainer)",
                              s->run.trainer);
    if (r->comp.cuda && strcmp(s->train.dtype, "fp32") != 0)
        return ctrl_error_set(
            CTRL_ERR_UNSUPPORTED,
            "%s: [train] dtype = %s with [memory] strategies = zero3 on [run] device = cuda: "
            "not supported yet (fp32 is)",
            ctrl_config_where(r->cfg, "train", "dtype"), s->train.dtype);
    if (r->comp.cuda && s->peft.enabled)
        return ctrl_error_set(
            CTRL_ERR_UNSUPPORTED,
            "%s: [peft] enabled = true with [memory] strategies = zero3 on [run] device = cuda: "
            "not supported yet (full fine-tuning is)",
            ctrl_config_where(r->cfg, "peft", "enabled"));
    if (k == &train_kind_sequence && spec->sync_ref_model)
        return ctrl_error_set(
            CTRL_ERR_UNSUPPORTED,
            "%s: [%s] sync_ref_model = true with [memory] strategies = zero3: not supported "
            "yet (the sync reads the whole policy after every step)",
            ctrl_config_where(r->cfg, s->run.trainer, "sync_ref_model"), s->run.trainer);
    if (k == &train_kind_online && s->generation.server)
        return ctrl_error_set(
            CTRL_ERR_UNSUPPORTED,
            "%s: [generation] mode = server with [memory] strategies = zero3: not supported "
            "yet (the weights pushed after each step are the whole model's); use colocate",
            ctrl_config_where(r->cfg, "generation", "mode"));
    return CTRL_OK;
}

/* [memory] offload_dir: only where the CPU's activation store is a file, and an existing directory. */
static ctrl_status offload_dir_check(const run_state *r, int offload) {
    const char *dir = r->s->memory.offload_dir;
    struct stat sb;
    if (!dir) return CTRL_OK;
    if (!(offload & 2) || r->comp.device.type != CTRL_DEVICE_CPU)
        return ctrl_error_set(CTRL_ERR_CONFIG,
                              "%s: [memory] offload_dir is where offload_activations keeps the layer inputs "
                              "on the CPU; this run %s: drop it",
                              ctrl_config_where(r->cfg, "memory", "offload_dir"),
                              !(offload & 2) ? "does not list offload_activations"
                                             : "is on a device (host memory)");
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return ctrl_error_set(CTRL_ERR_CONFIG, "%s: [memory] offload_dir = %s: not a directory",
                              ctrl_config_where(r->cfg, "memory", "offload_dir"), dir);
    return CTRL_OK;
}

/* Several ranks: each rank's resident memory right after loading the model (its peak so far is the
 * loading's), the most over the ranks logged by rank 0 -- what zero3's sliced loading lowers. */
static ctrl_status report_load_memory(const run_state *r, int sliced) {
    if (ctrl_collective_size() < 2) return CTRL_OK;
    double v[2];
    train_memory_read(&v[0], &v[1]);
    ctrl_status st = ctrl_collective_allreduce_max_f64(v, 2);
    if (st == CTRL_OK && r->root)
        CTRL_INFO("after loading the model%s: process memory per rank at most %.0f kB, %.0f kB at its peak "
                  "(VmRSS, VmHWM)",
                  sliced ? " (zero3: each rank's slices)" : " (whole on every rank)", v[0], v[1]);
    return st;
}

/* Loads the trainer, the model (its weights from `weights_dir` when resuming), the tokenizer, the
 * trainer kind's data, the optimizer: the plugins the config resolved. */
static ctrl_status setup(run_state *r, const char *weights_dir) {
    const ctrl_config *cfg = r->cfg;
    const ctrl_run_settings *s = r->s;
    const ctrl_run_plugins *p = ctrl_config_plugins(cfg);
    const ctrl_host *host = ctrl_host_table();
    const ctrl_memory_ops *layer_strategy = NULL;
    int zero_stage = 0, offload = 0;
    const ctrl_attention_ops *attention = p->attention->ops;
    r->trainer_ops = p->trainer->ops;
    r->opt_ops = p->optimizer->ops;
    ctrl_status st = memory_strategies(cfg, p, &layer_strategy, &zero_stage, &offload);
    if (st == CTRL_OK) st = train_compute_select(s->run.device, &r->comp);
    if (st == CTRL_OK) st = offload_dir_check(r, offload);
    if (st == CTRL_OK && (offload & 1) && r->comp.device.type == CTRL_DEVICE_CPU)
        st = ctrl_error_set(
            CTRL_ERR_CONFIG,
            "[memory] strategies = offload_optimizer with [run] device = %s: the model and the "
            "optimizer state are in host memory already, there is nothing to offload (drop "
            "offload_optimizer, or train on cuda)",
            s->run.device);
    if (st == CTRL_OK) st = train_kind_for(r->trainer_ops, s->run.trainer, &r->kind_ops);
    if (st == CTRL_OK && s->teacher.path && r->kind_ops != &train_kind_distill)
        st = ctrl_error_set(CTRL_ERR_CONFIG,
                            "%s: [teacher] path: trainer %s has no teacher (a distillation "
                            "trainer, gkd, has)",
                            ctrl_config_where(cfg, "teacher", "path"), s->run.trainer);
    if (st == CTRL_OK) st = r->trainer_ops->create(host, cfg, &r->trainer);
    train_model_on_cpu(st == CTRL_OK && !r->comp.cuda && zero_stage < 3); /* LoRA: a bf16 base as it loads */
    /* a trainer with a score head (reward) trains a sequence classifier: a causal LM's trunk under a
     * fresh score (seeded), or a classifier's own */
    ctrl_sequence_spec spec = {.size = sizeof spec};
    if (st == CTRL_OK && TRAINER_HAS(r->trainer_ops, sequence_spec))
        st = r->trainer_ops->sequence_spec(r->trainer, &spec);
    if (st == CTRL_OK && zero_stage >= 3) st = zero3_supported(r, &spec); /* before any loading */
    if (st == CTRL_OK && s->peft.enabled && s->peft.save_score && !spec.needs_score)
        st = ctrl_error_set(CTRL_ERR_CONFIG,
                            "%s: [peft] modules_to_save = score: trainer %s trains a causal LM, which has "
                            "no score head (the reward trainer trains one, as PEFT's task_type SEQ_CLS)",
                            ctrl_config_where(cfg, "peft", "modules_to_save"), s->run.trainer);
    /* zero3 on several ranks: each reads its slices only (a LoRA or classifier run reads the whole) */
    const int sliced = zero_stage >= 3 && ctrl_collective_size() > 1 && !s->peft.enabled && !spec.needs_score;
    if (st == CTRL_OK && sliced)
        st = train_zero_load(weights_dir ? weights_dir : s->model.path, attention, &r->model);
    if (st == CTRL_OK && !sliced) /* with [peft]: PEFT's SEQ_CLS, the score trained beside the adapters */
        st = train_model_load(s, attention, weights_dir, spec.needs_score ? 1 : 0, &r->model);
    /* [train] router_aux_loss_coef on a dense model is refused, as TRL raises (train/moe_aux.h) */
    if (st == CTRL_OK) st = train_moe_aux_check(cfg, r->model);
    if (st == CTRL_OK && (r->kind_ops == &train_kind_distill || spec.needs_score))
        st = train_moe_aux_not_added(cfg, r->model, s->run.trainer);
    if (st == CTRL_OK) st = train_compute_attach(&r->comp, r->model, s->train.dtype, layer_strategy, cfg);
    if (st == CTRL_OK && zero_stage < 3) st = train_model_hold_base(r->model, s); /* LoRA + bf16 */
    if (st == CTRL_OK && (offload & 2) && ctrl_model_set_offload_activations(r->model, 1) != CTRL_OK) {
        char why[512]; /* the model's reason, copied before the message is set anew */
        snprintf(why, sizeof why, "%s", ctrl_error_message());
        st = ctrl_error_set(CTRL_ERR_CONFIG, "[memory] strategies = offload_activations: %s", why);
    }
    if (st == CTRL_OK && (offload & 2) && r->comp.device.type == CTRL_DEVICE_CPU) /* the file's place */
        st = ctrl_model_set_offload_dir(r->model,
                                        s->memory.offload_dir ? s->memory.offload_dir : s->run.output_dir);
    if (st == CTRL_OK) st = ctrl_tokenizer_load(s->model.path, &r->tok);
    if (st == CTRL_OK) {
        const train_kind_env env = {.cfg = cfg,
                                    .settings = s,
                                    .plugins = p,
                                    .model = r->model,
                                    .tok = r->tok,
                                    .trainer_ops = r->trainer_ops,
                                    .trainer = r->trainer,
                                    .whole_weights = train_zero_whole,
                                    .whole_ctx = &r->zero};
        st = r->kind_ops->create(&env, &r->kind);
    }
    if (st == CTRL_OK && r->kind_ops->tokenizer_only_at_create) {
        ctrl_tokenizer_free(r->tok);
        r->tok = NULL;
        train_release_free_memory();
    }
    if (st == CTRL_OK)
        st = train_dp_init(&r->dp, r->kind_ops, r->kind, s->train.per_device_train_batch_size,
                           s->train.gradient_accumulation_steps);
    if (st == CTRL_OK && !sliced)
        st = train_dp_broadcast_weights(&r->dp, r->model); /* sliced: the same files */
    if (st == CTRL_OK) st = report_load_memory(r, sliced);
    /* the buckets' auto: hidden^2 and 0.9 x hidden^2 floats, as the HF Trainer fills DeepSpeed's */
    const double hidden = r->model ? (double)ctrl_model_cfg(r->model)->hidden_size : 0;
    const size_t prefetch = s->memory.prefetch_bucket_size >= 0 ? (size_t)s->memory.prefetch_bucket_size
                                                                : (size_t)(0.9 * hidden * hidden);
    const size_t bucket = s->memory.reduce_bucket_size >= 0
                              ? (size_t)s->memory.reduce_bucket_size
                              : (size_t)(hidden * hidden > 1 ? hidden * hidden : 1);
    if (st == CTRL_OK)
        st = train_zero_init(&r->zero, zero_stage, r->model, bucket, prefetch, s->memory.overlap_comm,
                             offload & 1);
    if (st != CTRL_OK) return st;
    /* One parameter group per trainable tensor (with LoRA the adapters and modules_to_save only:
     * the frozen base gets no optimizer state); norms and biases get no weight decay (as the HF
     * Trainer). On a device the optimizer is offered the device's buffers first; one that cannot
     * step there (CTRL_ERR_UNSUPPORTED) steps the host copies. With ZeRO the groups are clipped to
     * this rank's slice, stepped on the host. */
    r->groups = calloc((size_t)ctrl_model_view_count(r->model), sizeof *r->groups);
    if (!r->groups) return ctrl_error_set(CTRL_ERR_NOMEM, "train: out of memory");
    const ctrl_device dev = ctrl_model_device(r->model);
    if (dev.type != CTRL_DEVICE_CPU && (offload & 1))
        CTRL_INFO("optimizer %s: steps on the host, its state in host memory ([memory] strategies = "
                  "offload_optimizer)",
                  s->train.optimizer);
    if (dev.type != CTRL_DEVICE_CPU && !r->zero.stage && !(offload & 1)) {
        set_groups(r, ctrl_model_device_params(r->model), ctrl_model_device_grads(r->model, NULL));
        st = r->opt_ops->create(host, cfg, r->groups, r->n_groups, dev, &r->opt);
        if (st == CTRL_OK) {
            r->opt_on_device = 1;
            CTRL_INFO("optimizer %s: steps on the device", s->train.optimizer);
            return CTRL_OK;
        }
        if (st != CTRL_ERR_UNSUPPORTED) return st;
        CTRL_INFO("optimizer %s: steps on the host (%s)", s->train.optimizer, ctrl_error_message());
    }
    set_groups(r, ctrl_model_params(r->model, NULL), ctrl_model_grads(r->model, NULL));
    if (r->zero.stage) r->n_groups = train_zero_shard_groups(&r->zero, r->model, r->groups, r->n_groups);
    /* zero2 on a CUDA model: the slices (parameters and gradient sums) are the device's */
    st = r->opt_ops->create(host, cfg, r->groups, r->n_groups,
                            r->zero.dev ? dev : (ctrl_device){CTRL_DEVICE_CPU, 0}, &r->opt);
    if (r->zero.dev && st == CTRL_ERR_UNSUPPORTED)
        return ctrl_error_wrap(
            st,
            "[memory] strategies = zero2 with [run] device = cuda: optimizer %s cannot step "
            "on the device (add offload_optimizer to step on the host)",
            s->train.optimizer);
    if (st == CTRL_OK && r->zero.dev) {
        r->opt_on_device = 1;
        CTRL_INFO(
            "optimizer %s: steps this rank's slices on the device (zero2: the gradients reduce-scattered "
            "over NCCL during the backward)",
            s->train.optimizer);
    }
    if (st == CTRL_OK) st = train_zero_report(&r->zero, s->train.optimizer, r->opt_ops, r->opt);
    return st == CTRL_OK ? train_zero_attach(&r->zero, r->model) : st; /* zero3: the layers sliced */
}

static void teardown(run_state *r) {
    if (r->kind) r->kind_ops->destroy(r->kind);
    if (r->opt) r->opt_ops->destroy(r->opt);
    if (r->trainer) r->trainer_ops->destroy(r->trainer);
    train_compute_free(&r->comp);
    ctrl_tokenizer_free(r->tok);
    ctrl_model_free(r->model);
    free(r->groups);
    train_dp_report(&r->dp);
    train_dp_free(&r->dp);
    train_zero_free(&r->zero);
    train_metrics_close(&r->metrics);
}

/* One optimizer step: the kind accumulates the gradients of `ga` micro-batches of `bs` rows taken
 * from order[*cursor...] (this rank's share of them, averaged over the ranks); then their norm, the
 * health check, clipping, the optimizer. */
static ctrl_status train_step(run_state *r, const int *order, long *cursor, int bs, int ga, double lr,
                              long step, train_step_stats *out, double *grad_norm) {
    memset(out, 0, sizeof *out);
    const long start = *cursor;
    long mine = start;
    const int on_device = ctrl_model_device(r->model).type != CTRL_DEVICE_CPU;
    train_memory_mark(&r->mem); /* the first step only: before it, after the backward, at its end */
    ctrl_status st = train_zero_zero_grad(&r->zero, r->model); /* zero3: the units outside the layers */
    ctrl_model_set_training(r->model, 1, (uint64_t)step); /* LoRA dropout: masks a function of the step */
    if (st == CTRL_OK)
        st = r->kind_ops->accumulate(r->kind, train_dp_share(&r->dp, order, start), &mine, bs, ga, out);
    ctrl_model_set_training(r->model, 0, 0);
    st = train_dp_reduce_step(&r->dp, st, out);
    *cursor = train_dp_advance(&r->dp, start, mine);
    if (r->mem.marks == 1) train_memory_mark(&r->mem);
    double sum_sq = 0;
    if (r->zero.stage) { /* this rank's slice, on the host */
        if (st == CTRL_OK) st = train_zero_reduce_grads(&r->zero, r->model, &sum_sq);
    } else {
        if (st == CTRL_OK) st = train_dp_average_grads(&r->dp, r->model, on_device);
        if (st == CTRL_OK) st = ctrl_model_grad_sum_squares(r->model, &sum_sq); /* on the model's backend */
    }
    if (st != CTRL_OK) return st;
    *grad_norm = sqrt(sum_sq);
    if ((st = train_health_step(step, out->loss, *grad_norm)) != CTRL_OK) return st;
    /* torch.nn.utils.clip_grad_norm_: scale by max_norm / (norm + 1e-6) when that is below 1. */
    /* On the CPU an optimizer that can scales the gradients as it reads them (step_scaled): one
     * pass less over them, the same values. */
    const ctrl_optimizer_ops *oo = r->opt_ops;
    const int fuse = !on_device && !r->zero.stage &&
                     oo->size >= offsetof(ctrl_optimizer_ops, step_scaled) + sizeof oo->step_scaled &&
                     oo->step_scaled;
    float scale = 1.0f;
    const double max_norm = r->s->train.max_grad_norm;
    if (max_norm > 0) {
        double coef = max_norm / (*grad_norm + 1e-6);
        if (coef < 1 && r->zero.stage) st = train_zero_scale_grads(&r->zero, r->model, (float)coef);
        if (coef < 1 && fuse) scale = (float)coef;
        if (coef < 1 && !r->zero.stage && !fuse) st = ctrl_model_scale_grads(r->model, (float)coef);
    }
    if (st == CTRL_OK && !r->opt_on_device && !r->zero.stage) st = ctrl_model_grads_to_host(r->model);
    if (st == CTRL_OK)
        st = fuse ? oo->step_scaled(r->opt, r->groups, r->n_groups, lr, step + 1, scale)
                  : oo->step(r->opt, r->groups, r->n_groups, lr, step + 1);
    if (st == CTRL_OK && r->zero.stage) st = train_zero_gather_params(&r->zero, r->model);
    if (st == CTRL_OK && r->kind_ops->optimizer_step) st = r->kind_ops->optimizer_step(r->kind, lr, step + 1);
    if (r->opt_on_device)
        ctrl_model_device_weights_changed(r->model);
    else
        ctrl_model_weights_changed(r->model);
    if (st == CTRL_OK && r->kind_ops->after_step) st = r->kind_ops->after_step(r->kind, step + 1);
    if (st == CTRL_OK && r->mem.marks == 2) {
        train_memory_mark(&r->mem);
        if (r->root && ctrl_model_device(r->model).type == CTRL_DEVICE_CPU) /* host memory is the model's */
            train_memory_log(&r->mem, r->model, r->s->train.optimizer);
    }
    return st;
}

static void progress(long step, long total, double rate, double eta, double loss) {
    if (isatty(fileno(stderr))) {
        int width = 30, done = (int)(width * step / (total ? total : 1));
        fprintf(stderr, "\r[%.*s%*s] %ld/%ld  %.0f tok/s  ETA %.0fs  loss %.4f ", done,
                "##############################", width - done, "", step, total, rate, eta, loss);
        if (step == total) fputc('\n', stderr);
    }
}

static ctrl_status log_window(run_state *r, ctrl_train_state *ts, long total, double lr, double rate) {
    const double n = ts->win;
    train_health_window(&r->health, ts->step, ts->win, ts->win_norm / n, ts->win_loss / n, lr);
    const train_window w = {.step = ts->step,
                            .total = total,
                            .loss = ts->win_loss / n,
                            .grad_norm = ts->win_norm / n,
                            .learning_rate = lr,
                            .entropy = ts->win_ent / n,
                            .accuracy = ts->win_acc / n,
                            .tokens_per_second = rate};
    FILE *f = train_metrics_stage(&r->metrics);
    fprintf(f, "{\"step\": %ld, ", ts->step);
    r->kind_ops->log_window(r->kind, &w, f);
    fprintf(f, "\"num_tokens\": %ld, \"epoch\": %.4f, \"tokens_per_second\": %.1f}\n", ts->num_tokens,
            (double)ts->cursor / r->kind_ops->row_count(r->kind), rate);
    ts->win_loss = ts->win_acc = ts->win_norm = ts->win_ent = 0, ts->win = 0;
    return train_metrics_commit(&r->metrics);
}

static ctrl_status kind_save_state(void *user, const char *dir) {
    run_state *r = user;
    return r->kind_ops->save_state(r->kind, dir);
}

static ctrl_status save_checkpoint(run_state *r, const char *out_dir, const ctrl_train_state *ts) {
    char dir[4200];
    const int keep = r->s->train.save_total_limit;
    ctrl_status st = train_zero_gather_all(&r->zero); /* zero3: the whole model for the save */
    if (st == CTRL_OK) st = train_dp_check_weights(&r->dp, r->model, ts->step);
    if (st == CTRL_OK && !r->root && r->zero.stage) /* ZeRO: its slice of the state to rank 0 */
        st = train_zero_send_state(&r->zero, r->opt_ops, r->opt);
    const ctrl_checkpoint_shards shards = {r->zero.size, train_zero_write_shard, &r->zero};
    const ctrl_checkpoint_extra extra = {kind_save_state, r}; /* a value model */
    if (st == CTRL_OK && r->root)                             /* rank 0 writes */
        st = ctrl_checkpoint_save(out_dir, r->model, r->s->model.path, r->opt_ops, r->opt, ts,
                                  r->zero.stage ? &shards : NULL, r->kind_ops->save_state ? &extra : NULL,
                                  keep, dir, sizeof dir);
    if (st == CTRL_OK && r->root) CTRL_INFO("checkpoint saved to %s", dir);
    train_zero_release_all(&r->zero);
    return st;
}

/* An evaluation at `step` by the ranks that evaluate (has_eval); with zero3 every rank first gathers
 * the layers (a collective), and releases them after. */
static ctrl_status evaluate(run_state *r, int has_eval, long step) {
    const int any = r->kind_ops->has_eval(r->kind); /* the same on every rank */
    ctrl_status st = any ? train_zero_gather_all(&r->zero) : CTRL_OK;
    if (st == CTRL_OK && has_eval)
        st = r->kind_ops->evaluate(r->kind, step, train_metrics_stage(&r->metrics));
    if (st == CTRL_OK && has_eval)
        st = train_metrics_commit(&r->metrics); /* the root's lines to every sink */
    if (any) train_zero_release_all(&r->zero);
    return st;
}

/* After the first step of a partitioned ZeRO run: the gradient memory each rank held during the
 * backward (the most resident just before a bucket's reduction) and, zero3, the parameter and
 * gradient memory between steps (mincore), logged by rank 0. */
static ctrl_status report_resident(run_state *r) {
    size_t n_params = 0, n_grads = 0;
    if (r->zero.vm_params) { /* zero3 on a CUDA model: what each rank holds mapped in device memory */
        n_params = ctrl_model_param_bytes(r->model) / sizeof(float); /* not ctrl_model_params: no copy */
        ctrl_model_grads(r->model, &n_grads);
        double v[8] = {0};
        const size_t piece = train_zero_device_mapped(&r->zero, v);
        v[4] = (double)(r->zero.acc_n * sizeof(float)),
        v[5] = (double)train_zero_state_bytes(r->opt_ops, r->opt);
        ctrl_status st = ctrl_collective_allreduce_max_f64(v, 6);
        if (st == CTRL_OK && r->root)
            CTRL_INFO(
                "zero3 on the device: per rank between steps at most %.0f of the model's %zu bytes of "
                "parameters (layers %zu bytes, sliced over %d ranks), %.0f of %zu bytes of gradients, %.0f "
                "bytes of gradient slices' sums and %.0f of optimizer state; the most mapped in the first "
                "step: "
                "parameters %.0f, gradients %.0f bytes (pieces of %zu bytes); %ld layer gathers prefetched "
                "(prefetch_bucket_size = %zu floats)",
                v[0], n_params * sizeof(float), train_zero_layer_bytes(&r->zero), r->zero.size, v[2],
                n_grads * sizeof(float), v[4], v[5], v[1], v[3], piece, r->zero.prefetched, r->zero.prefetch);
        return st;
    }
    if (r->zero.dev) { /* zero2 on a CUDA model: what each rank holds in device memory */
        n_params = ctrl_model_param_bytes(r->model) / sizeof(float); /* not ctrl_model_params: no copy */
        ctrl_model_grads(r->model, &n_grads);
        double v[2] = {(double)(r->zero.acc_n * sizeof(float)),
                       (double)train_zero_state_bytes(r->opt_ops, r->opt)};
        ctrl_status st = ctrl_collective_allreduce_max_f64(v, 2);
        if (st == CTRL_OK && r->root)
            CTRL_INFO(
                "zero2 on the device: per rank at most %.0f bytes of gradient slices' sums (of %zu) and %.0f "
                "of optimizer state; parameters %zu bytes and the backward's gradient buffer %zu bytes, "
                "whole",
                v[0], n_grads * sizeof(float), v[1], n_params * sizeof(float), n_grads * sizeof(float));
        return st;
    }
    const float *p = ctrl_model_params(r->model, &n_params), *g = ctrl_model_grads(r->model, &n_grads);
    train_zero *z = &r->zero;
    double v[5] = {(double)train_zero_resident(p, n_params * sizeof *p),
                   (double)train_zero_resident(g, n_grads * sizeof *g), (double)z->grad_peak, 0, 0};
    train_memory_read(&v[3], &v[4]);
    z->measure = 0;
    ctrl_status st = ctrl_collective_allreduce_max_f64(v, 5);
    if (st != CTRL_OK || !r->root) return st;
    int buckets = 0;
    for (int l = 0; l < ctrl_model_cfg(r->model)->n_layers; l++) buckets += z->closes[l] != 0;
    CTRL_INFO(
        "zero%d: gradients during the backward: at most %.0f of %zu bytes resident per rank (%d buckets "
        "of layers, reduce_bucket_size = %zu floats%s); averaged slices kept: %zu bytes",
        z->stage, v[2], n_grads * sizeof *g, buckets, z->bucket,
        r->s->memory.reduce_bucket_size < 0 ? ": auto, hidden^2" : "", z->acc_n * sizeof(float));
    if (z->stage >= 3)
        CTRL_INFO("zero3: parameters resident between steps: at most %.0f of the model's %zu bytes per rank "
                  "(layers %zu bytes, sliced over %d ranks); gradients: at most %.0f of %zu bytes; %ld layer "
                  "gathers prefetched in the step (prefetch_bucket_size = %zu floats%s)",
                  v[0], n_params * sizeof *p, train_zero_layer_bytes(z), z->size, v[1], n_grads * sizeof *g,
                  z->prefetched, z->prefetch,
                  r->s->memory.prefetch_bucket_size < 0 ? ": auto, 0.9 x hidden^2" : "");
    if (z->stage >= 3)
        CTRL_INFO("zero3: process memory per rank at most %.0f kB now, %.0f kB at its peak (VmRSS, VmHWM)",
                  v[3], v[4]);
    return st;
}

/* offload_activations, after the first step (its last forward's layout): the bytes of layer inputs
 * in host memory and of activations on the device. */
static void report_offload(const run_state *r) {
    size_t one = 0;
    const size_t host = ctrl_model_offloaded_bytes(r->model, &one),
                 dev = ctrl_model_activation_bytes(r->model);
    const int cpu = ctrl_model_device(r->model).type == CTRL_DEVICE_CPU;
    const char *where = cpu ? "a file"
                        : ctrl_model_offload_overlapped(r->model)
                            ? "page-locked host memory, copied on a side stream"
                            : "host memory";
    CTRL_INFO(
        "offload_activations: %zu bytes of layer inputs in %s; activations in %s memory: %zu bytes (%zu "
        "with every input there)",
        host, where, cpu ? "host" : "device", dev, dev + host - 2 * one);
}

/* Interrupted after step ts->step (or during the next one, whose partial work is dropped): a
 * checkpoint of that step; the model is saved by the caller. */
static ctrl_status save_interrupted(run_state *r, const char *out_dir, const ctrl_train_state *ts,
                                    const char *when) {
    ctrl_status st = save_checkpoint(r, out_dir, ts);
    if (st != CTRL_OK) return st;
    return ctrl_error_set(CTRL_ERR_INTERRUPTED,
                          "interrupted %s step %ld: checkpoint and model saved; continue with [train] "
                          "resume_from_checkpoint = last",
                          when, !strcmp(when, "after") ? ts->step : ts->step + 1);
}

/* Why the run stopped at a failed step: what is left to resume from. */
static void name_last_checkpoint(ctrl_status st, const char *out_dir) {
    char last[4200];
    if (ctrl_checkpoint_last(out_dir, last, sizeof last))
        ctrl_error_append(st, "the last good checkpoint, %s, is intact", last);
    else
        ctrl_error_append(st, "no checkpoint was saved before it");
}

/* The steps: schedule, logging window, evaluation cadence, checkpoints, interruption. */
static ctrl_status run_steps(run_state *r, ctrl_train_state *ts, const char *out_dir,
                             int (*interrupted)(void)) {
    const ctrl_run_settings *s = r->s;
    const int bs = s->train.per_device_train_batch_size;
    const int ga = s->train.gradient_accumulation_steps;
    const int n_rows = r->kind_ops->row_count(r->kind);
    const long rows_per_step = r->kind_ops->rows_per_step(r->kind, bs, ga) * r->dp.size;
    const long per_epoch = (n_rows + rows_per_step - 1) / rows_per_step;
    long total = s->train.max_steps;
    if (total <= 0) total = (long)ceil(s->train.num_train_epochs * per_epoch);
    ts->n_examples = n_rows, ts->max_steps = total;
    long warmup = s->train.warmup_steps;
    if (warmup <= 0) warmup = (long)ceil(s->train.warmup_ratio * total);
    const double lr0 = s->train.learning_rate;
    const double min_lr = s->train.min_lr_rate;
    const char *sched = s->train.lr_scheduler_type;
    const long log_every = s->train.logging_steps;
    const long save_every = s->train.save_steps;
    const char *save_strategy = s->train.save_strategy;
    const int saving = !save_strategy || strcmp(save_strategy, "no") != 0;
    const long eval_every = s->train.eval_steps;
    const int shuffle = s->data.shuffle;
    /* rank 0 evaluates, or every rank for a kind that splits the work itself */
    const int has_eval = (r->root || r->kind_ops->splits_ranks) && r->kind_ops->has_eval(r->kind);
    size_t n_params;
    ctrl_model_params(r->model, &n_params);
    r->kind_ops->describe(r->kind, total, bs, ga, n_params);
    if (r->dp.size > 1)
        CTRL_INFO("data parallel: %d ranks x %d x %d (effective batch %ld)", r->dp.size, bs, ga,
                  (long)r->dp.size * bs * ga);
    int *order = malloc(sizeof(int) * (size_t)(n_rows > 0 ? n_rows : 1));
    if (!order) return ctrl_error_set(CTRL_ERR_NOMEM, "train: out of memory");
    long epoch_seen = -1;
    const long start_step = ts->step, start_tokens = ts->num_tokens;
    const double t_start = now();
    ctrl_status st = CTRL_OK;
    if (r->kind_ops->eval_at_start && ts->step == 0) st = evaluate(r, has_eval, 0);
    while (ts->step < total && st == CTRL_OK) {
        const long step = ts->step, epoch = ts->cursor / n_rows;
        if (epoch != epoch_seen) { /* the order is a function of (seed, epoch): resumable */
            shuffled(order, n_rows, ts->seed + (uint64_t)epoch, shuffle);
            epoch_seen = epoch;
        }
        const double lr = ctrl_lr_at(sched ? sched : "linear", lr0, step, total, warmup, min_lr);
        train_step_stats s;
        double grad_norm = 0;
        const double t_step = now();
        const long cursor0 = ts->cursor;
        st = train_step(r, order, &ts->cursor, bs, ga, lr, step, &s, &grad_norm);
        if (r->kind_ops->step_time) r->kind_ops->step_time(r->kind, now() - t_step);
        if (st == CTRL_ERR_INTERRUPTED) { /* long work inside the step (tokenizing a long row) */
            ts->cursor = cursor0;         /* the step did not happen: the state is the last step's */
            if (ts->step > start_step) st = save_interrupted(r, out_dir, ts, "during");
            break;
        }
        if (st != CTRL_OK) {
            if (st == CTRL_ERR_RUNTIME) name_last_checkpoint(st, out_dir); /* non-finite loss */
            break;
        }
        ts->step++, ts->num_tokens += s.tokens;
        ts->win_loss += s.loss, ts->win_acc += s.accuracy, ts->win_norm += grad_norm,
            ts->win_ent += s.entropy;
        ts->win++;
        const double elapsed = now() - t_start, rate = (ts->num_tokens - start_tokens) / elapsed;
        if (r->root)
            progress(ts->step, total, rate, elapsed / (ts->step - start_step) * (total - ts->step), s.loss);
        if (r->root && (ts->step % log_every == 0 || ts->step == total))
            st = log_window(r, ts, total, lr, rate);
        if (st == CTRL_OK && r->zero.partitioned && ts->step == start_step + 1) st = report_resident(r);
        if (r->root && ts->step == start_step + 1 && ctrl_model_offloaded_bytes(r->model, NULL))
            report_offload(r);
        if (st == CTRL_OK && eval_every > 0 && ts->step % eval_every == 0 && ts->step < total)
            st = evaluate(r, has_eval, ts->step);
        /* a checkpoint every save_steps, at the end (as the HF Trainer), and when interrupted */
        const int stop = train_dp_any(&r->dp, ts->step < total && interrupted && interrupted());
        if (st == CTRL_OK && stop) {
            st = save_interrupted(r, out_dir, ts, "after");
            break;
        }
        if (st == CTRL_OK && saving && (ts->step == total || (save_every > 0 && ts->step % save_every == 0)))
            st = save_checkpoint(r, out_dir, ts);
    }
    free(order);
    if (st == CTRL_OK) st = evaluate(r, has_eval, ts->step);
    return st;
}

ctrl_status ctrl_train_run(const ctrl_config *cfg, int (*interrupted)(void)) {
    const ctrl_run_settings *s = ctrl_config_settings(cfg);
    run_state r = {.cfg = cfg, .s = s, .root = ctrl_collective_is_root()};
    ctrl_collective_set_timeout(s->train.ddp_timeout);
    const char *out_dir = s->run.output_dir;
    const char *resume = s->train.resume_from_checkpoint;
    char ckpt[4200] = "";
    ctrl_status st = resume ? ctrl_checkpoint_resolve(out_dir, resume, ckpt, sizeof ckpt) : CTRL_OK;
    if (st == CTRL_OK) st = setup(&r, ckpt[0] ? ckpt : NULL);
    const uint64_t seed = s->run.seed;
    ctrl_train_state ts = {.seed = seed, .world_size = ctrl_collective_size()};
    ts.zero_stage = r.zero.stage, ts.zero_layout = train_zero_layout(&r.zero);
    snprintf(ts.optimizer, sizeof ts.optimizer, "%s", s->train.optimizer);
    if (st == CTRL_OK && ckpt[0]) {
        st = ctrl_checkpoint_load_state(ckpt, s->train.optimizer, r.opt_ops, r.opt, r.zero.stage,
                                        ctrl_collective_rank(), &ts);
        ts.zero_stage = r.zero.stage; /* zero1 <-> a CUDA zero2: the same slices */
        const int rows = st == CTRL_OK ? r.kind_ops->row_count(r.kind) : 0;
        if (st == CTRL_OK && ts.seed != seed)
            CTRL_WARN("resuming with [run] seed = %llu; the checkpoint was made with seed %llu",
                      (unsigned long long)seed, (unsigned long long)ts.seed),
                ts.seed = seed;
        if (st == CTRL_OK && ts.n_examples != rows)
            CTRL_WARN("the checkpoint was made on %ld training examples, this run has %d: the data order "
                      "differs from the interrupted run's",
                      ts.n_examples, rows);
        if (st == CTRL_OK && r.kind_ops->load_state) st = r.kind_ops->load_state(r.kind, ckpt, ts.step);
        if (st == CTRL_OK) CTRL_INFO("resuming from %s at step %ld", ckpt, ts.step);
    }
    if (st == CTRL_OK && r.root)
        st = train_metrics_open(&r.metrics, out_dir, ts.step, s->train.report_tensorboard);
    const long start_step = ts.step;
    if (st == CTRL_OK) st = run_steps(&r, &ts, out_dir, interrupted);
    /* Save on success, and on an interruption once a step was trained (interrupted while loading,
     * or during the first step, the model is what it was: output_dir keeps what it holds); never
     * after a failed step. */
    const int saving = st == CTRL_OK || st == CTRL_ERR_INTERRUPTED;
    /* zero3: each layer gathered to rank 0 alone when the save reaches it (zero_save.c); else (and
     * with LoRA) the whole model on every rank first */
    const int streamed = saving && train_zero_save_streams(&r.zero);
    if (saving && !streamed) {
        ctrl_status g = train_zero_gather_all(&r.zero);
        st = g != CTRL_OK ? g : st;
    }
    /* never a diverged model (zero3's slices have one owner each: nothing to compare) */
    if (st == CTRL_OK && !streamed) st = train_dp_check_weights(&r.dp, r.model, ts.step);
    const int progressed = st == CTRL_OK || (st == CTRL_ERR_INTERRUPTED && ts.step > start_step);
    if (st == CTRL_ERR_INTERRUPTED && !progressed)
        ctrl_error_append(st, "interrupted before a step was trained: nothing saved");
    if (progressed && streamed) train_zero_save_begin(&r.zero);
    if (progressed && streamed && !r.root) { /* rank 0 saves: this rank sends its slices */
        ctrl_status e = train_zero_save_serve(&r.zero);
        st = e != CTRL_OK ? e : st;
    }
    if (progressed && r.root) {
        ctrl_error_saved run; /* an interruption's message, kept across the save */
        ctrl_error_save(&run, st);
        ctrl_status s2 = train_model_export(r.model, out_dir, s);
        if (streamed) { /* the other ranks stop serving, however the save went */
            const ctrl_status e = train_zero_save_end(&r.zero);
            s2 = s2 != CTRL_OK ? s2 : e;
        }
        if (s2 == CTRL_OK) s2 = ctrl_copy_tokenizer_files(s->model.path, out_dir);
        if (s2 == CTRL_OK && s->data.chat_template_path)
            s2 = ctrl_save_chat_template(s->data.chat_template_path, out_dir);
        if (s2 != CTRL_OK)
            st = s2;
        else {
            CTRL_INFO("%s saved to %s", ctrl_model_lora(r.model) ? "LoRA adapter (PEFT format)" : "model",
                      out_dir);
            ctrl_error_restore(&run);
        }
    }
    if (progressed && streamed) train_zero_save_report(&r.zero);
    teardown(&r);
    if (progressed && r.root && s->train.report_png) { /* the plot is a convenience: never fails the run */
        char jsonl[4200], png[4200];
        ctrl_error_saved run;
        ctrl_error_save(&run, st);
        snprintf(jsonl, sizeof jsonl, "%s/metrics.jsonl", out_dir);
        snprintf(png, sizeof png, "%s/metrics.png", out_dir);
        if (ctrl_metrics_plot(jsonl, png) == CTRL_OK)
            CTRL_INFO("curves plotted to %s", png);
        else
            CTRL_WARN("%s", ctrl_error_message());
        ctrl_error_restore(&run);
    }
    return st;
}
