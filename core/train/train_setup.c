/* Setting a training run up and tearing it down: the [memory] strategies checked and sorted (a layer
 * strategy, a ZeRO stage, offload), what zero3 and offload_dir run with, the trainer, the model, the
 * tokenizer, the trainer kind's data, data parallelism and ZeRO, then the optimizer
 * (train_optimizer.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "collective/collective.h"
#include "model/lora.h"
#include "train/moe_aux.h"
#include "train/train_lora.h"
#include "train/offload_overlap.h"
#include "train/train_run.h"

/* Gives the heap's free pages back to the system (glibc keeps the small blocks a freed structure
 * was made of, e.g. a tokenizer's, in the process otherwise). */
static void train_release_free_memory(void) {
#if defined(__GLIBC__)
    malloc_trim(0);
#endif
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

/* What zero3 runs with so far: the token, sequence, online and distill kinds on the CPU and CUDA alike
 * (generation and server mode's pushes gather the whole model; GKD's teacher sliced on the host, held
 * whole on a device). */
static ctrl_status zero3_supported(const run_state *r) {
    const ctrl_run_settings *s = r->s;
    const train_kind_ops *k = r->kind_ops;
    if (k != &train_kind_token && k != &train_kind_sequence && k != &train_kind_online &&
        k != &train_kind_distill)
        return ctrl_error_set(CTRL_ERR_UNSUPPORTED,
                              "[memory] strategies = zero3 with trainer = %s: not supported yet (SFT, the "
                              "preference trainers, the online ones and GKD are; zero1 and zero2 work with "
                              "every trainer)",
                              s->run.trainer);
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

/* [memory] stage3_param_persistence_threshold: zero3's views kept whole (auto: 10 x hidden_size, as the
 * HF Trainer fills DeepSpeed's auto); refused without zero3. */
static ctrl_status persistence(run_state *r, int zero_stage, double hidden) {
    const long t = r->s->memory.param_persistence_threshold;
    const char *where = ctrl_config_where(r->cfg, "memory", "stage3_param_persistence_threshold");
    if (zero_stage < 3 && strcmp(where, "default") != 0)
        return ctrl_error_set(CTRL_ERR_CONFIG,
                              "%s: [memory] stage3_param_persistence_threshold: only zero3 slices parameters "
                              "(add zero3 to [memory] strategies, or drop the key)",
                              where);
    if (zero_stage < 3 || t == 0) return CTRL_OK;
    train_zero_set_persistence(&r->zero, t < 0 ? (size_t)(10 * hidden) : (size_t)t);
    return CTRL_OK;
}

/* A view stage 3 reads as each rank's slice outside the layers (train_dp_broadcast_weights' keep). */
static int sliced_outer_view(const ctrl_param_view *v) { return train_zero_outer_index(v) >= 0; }

/* zero3 with [peft] on several ranks: whether each rank reads only its slices of the frozen base (as
 * zero.Init partitions it at load; a classifier's too, its score whole). CTRL_TEST_ZERO3_WHOLE_LORA:
 * whole on every rank, sliced when ZeRO starts, to compare (rank 0 says so). */
static int lora_reads_sliced(const run_state *r, int zero_stage) {
    if (zero_stage < 3 || ctrl_collective_size() < 2 || !r->s->peft.enabled) return 0;
    const int whole = getenv("CTRL_TEST_ZERO3_WHOLE_LORA") != NULL;
    if (whole && r->root)
        CTRL_INFO(
            "zero3 + LoRA: the frozen base read whole on every rank (CTRL_TEST_ZERO3_WHOLE_LORA), sliced "
            "when ZeRO starts");
    return !whole;
}

/* Loads the trainer, the model (its weights from `weights_dir` when resuming), the tokenizer, the
 * trainer kind's data, the optimizer: the plugins the config resolved. */
ctrl_status train_run_setup(run_state *r, const char *weights_dir) {
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
    train_model_decodes(r->kind_ops == &train_kind_online || r->kind_ops == &train_kind_distill);
    /* a trainer with a score head (reward) trains a sequence classifier: a causal LM's trunk under a
     * fresh score (seeded), or a classifier's own */
    ctrl_sequence_spec spec = {.size = sizeof spec};
    if (st == CTRL_OK && TRAINER_HAS(r->trainer_ops, sequence_spec))
        st = r->trainer_ops->sequence_spec(r->trainer, &spec);
    if (st == CTRL_OK && zero_stage >= 3) st = zero3_supported(r); /* before any loading */
    if (st == CTRL_OK) st = train_zero_gen_check(cfg, zero_stage, r->kind_ops == &train_kind_online);
    if (st == CTRL_OK && s->peft.enabled && s->peft.save_score && !spec.needs_score)
        st = ctrl_error_set(CTRL_ERR_CONFIG,
                            "%s: [peft] modules_to_save = score: trainer %s trains a causal LM, which has "
                            "no score head (the reward trainer trains one, as PEFT's task_type SEQ_CLS)",
                            ctrl_config_where(cfg, "peft", "modules_to_save"), s->run.trainer);
    /* zero3 on several ranks: each reads its slices only (a classifier too: its score head, fresh or
     * read, whole on every rank, a fresh one seeded alike) */
    const int sliced = zero_stage >= 3 && ctrl_collective_size() > 1 && !s->peft.enabled;
    static ctrl_lora_config lora; /* [peft]'s, read once (large: the target list, not on the stack) */
    if (st == CTRL_OK && s->peft.enabled) st = train_lora_config(s, &lora);
    const int lora_sliced = st == CTRL_OK && lora_reads_sliced(r, zero_stage);
    const char *load_dir = weights_dir ? weights_dir : s->model.path;
    if (st == CTRL_OK && sliced && !spec.needs_score) st = train_zero_load(load_dir, attention, &r->model);
    if (st == CTRL_OK && sliced && spec.needs_score) {
        st = train_zero_load_classifier(load_dir, attention, 1, s->run.seed, &r->model);
        if (st == CTRL_OK)
            CTRL_INFO(
                "zero3: each rank read its slices of the classifier's layers and embeddings from %s (the "
                "final norm and the score head whole), not the whole model",
                load_dir);
    }
    train_model_zero3_sliced(lora_sliced);
    if (st == CTRL_OK && !sliced) /* with [peft]: PEFT's SEQ_CLS, the score trained beside the adapters */
        st = train_model_load(s, &lora, attention, weights_dir, spec.needs_score ? 1 : 0, &r->model);
    train_model_zero3_sliced(0);
    /* [train] router_aux_loss_coef on a dense model is refused, as TRL raises (train/moe_aux.h) */
    if (st == CTRL_OK) st = train_moe_aux_check(cfg, r->model);
    if (st == CTRL_OK && (r->kind_ops == &train_kind_distill || spec.needs_score))
        st = train_moe_aux_not_added(cfg, r->model, s->run.trainer);
    /* zero3 on devices: only each rank's slices of the parameters (zero_device.c) and of QLoRA's NF4
     * store (zero_nf4.c) go to its device, never the whole model */
    if (st == CTRL_OK && zero_stage >= 3 && ctrl_collective_size() > 1 && r->comp.cuda)
        ctrl_model_defer_device(r->model);
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
    /* the buckets' auto: hidden^2 and 0.9 x hidden^2 floats, as the HF Trainer fills DeepSpeed's */
    const double hidden = r->model ? (double)ctrl_model_cfg(r->model)->hidden_size : 0;
    const size_t prefetch = s->memory.prefetch_bucket_size >= 0 ? (size_t)s->memory.prefetch_bucket_size
                                                                : (size_t)(0.9 * hidden * hidden);
    if (st == CTRL_OK) {
        const train_kind_env env = {.cfg = cfg,
                                    .settings = s,
                                    .plugins = p,
                                    .model = r->model,
                                    .tok = r->tok,
                                    .trainer_ops = r->trainer_ops,
                                    .trainer = r->trainer,
                                    .whole_weights = train_zero_generation,
                                    .whole_ctx = &r->zgen,
                                    .gather_whole = train_zero_whole,
                                    .gather_ctx = &r->zero,
                                    .push_whole = train_zero_push,
                                    .push_ctx = &r->zero,
                                    .zero3_sliced = sliced,
                                    .zero3_prefetch = prefetch,
                                    .zero3_frozen = zero_stage >= 3 && ctrl_collective_size() > 1,
                                    .zero3_policy = zero_stage >= 3 ? &r->zero : NULL};
        train_zero_gen_init(&r->zgen, &r->zero, !s->generation.ds3_gather_for_generation);
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
    /* sliced: the same files (LoRA: the adapters, whole here; read sliced, a trained embed_tokens /
     * lm_head copy is each rank's slice: not sent) */
    if (st == CTRL_OK && !sliced)
        st = train_dp_broadcast_weights(&r->dp, r->model, lora_sliced ? sliced_outer_view : NULL);
    if (st == CTRL_OK && !zero_stage && !offload)
        st = train_dp_share_grads(&r->dp, r->model, s->train.ddp_shared_memory);
    if (st == CTRL_OK) st = train_run_report_load_memory(r, sliced || lora_sliced);
    const size_t bucket = s->memory.reduce_bucket_size >= 0
                              ? (size_t)s->memory.reduce_bucket_size
                              : (size_t)(hidden * hidden > 1 ? hidden * hidden : 1);
    if (st == CTRL_OK)
        st = train_zero_init(&r->zero, zero_stage, r->model, bucket, prefetch, s->memory.overlap_comm,
                             offload & 1);
    if (st == CTRL_OK && s->memory.overlap_comm && !r->zero.partitioned) /* nothing in the backward */
        st =
            ctrl_error_set(CTRL_ERR_CONFIG,
                           "%s: [memory] overlap_comm = true applies to zero2 and zero3, whose gradients are "
                           "reduce-scattered during the backward (here: %s)",
                           ctrl_config_where(r->cfg, "memory", "overlap_comm"),
                           !zero_stage ? "no ZeRO stage; plain data parallel all-reduces after the backward"
                           : zero_stage == 1 ? "zero1 all-reduces the gradients after the backward"
                                             : "zero2 with offload_optimizer on a device reduces on the host "
                                               "after the backward");
    if (st == CTRL_OK) st = persistence(r, zero_stage, hidden);
    if (st == CTRL_OK) st = train_run_optimizer_create(r, offload);
    /* the kind's work through the policy as set up (a LoRA policy's precomputed reference) */
    if (st == CTRL_OK && r->kind_ops->ready) st = r->kind_ops->ready(r->kind);
    return st;
}

void train_run_teardown(run_state *r) {
    train_offload_report(r->ov);
    train_offload_destroy(r->ov); /* the host step joined before the optimizer goes */
    r->ov = r->zero.ov = NULL;
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
