/* Loading and validating a run configuration (internal to the core and the CLI). The public,
 * read-only accessors are in include/ctrl/config.h. */
#ifndef CTRL_CORE_CONFIG_LOAD_H
#define CTRL_CORE_CONFIG_LOAD_H

#include <stdint.h>
#include <stdio.h>

#include <ctrl/config.h>
#include <ctrl/option.h>

#include "registry/registry.h"

/* What loading a run config resolves once, so that no module looks a plugin up by name later:
 * the plugins the config selects (their descriptors, whose `ops` the run uses) and, for each
 * [reward.NAME] section, its plugin and weight. Valid while the config and the registry it was
 * validated against live. */
#define CTRL_RUN_MAX_MEMORY 32
#define CTRL_RUN_MAX_REWARDS 32
typedef struct ctrl_run_reward {
    const char *section; /* "reward.NAME" */
    const char *name;    /* NAME: metric names (rewards/NAME/mean) */
    const ctrl_plugin *plugin;
    double weight;
} ctrl_run_reward;

typedef struct ctrl_run_plugins {
    const ctrl_plugin *trainer, *optimizer, *attention;
    /* [generation] attention: the paged attention the engine decodes with; NULL when the default
     * ("paged") is not loaded and the key is not set (a run that never decodes needs none). */
    const ctrl_plugin *decoder;
    const ctrl_plugin *memory[CTRL_RUN_MAX_MEMORY];
    int n_memory;
    ctrl_run_reward reward[CTRL_RUN_MAX_REWARDS];
    int n_rewards;
} ctrl_run_plugins;

/* The typed settings the training loops read (defaults filled, validated): the core sections'
 * keys by their INI names. Strings point into the config. */
typedef struct ctrl_run_settings {
    struct {
        const char *trainer, *output_dir, *device;
        const char *log_level; /* trace|debug|info|warn|error (the CLI's --log-level wins) */
        uint64_t seed;
    } run;
    struct {
        const char *path;
    } model;
    struct {
        const char *train_file, *eval_file, *chat_template_path; /* NULL when unset */
        const char *split, *eval_split;                          /* of a folder or Hub dataset id */
        const char *subset;                                      /* NULL when unset */
        const char *dataset_text_field, *messages_field, *prompt_field, *completion_field;
        const char *truncation_mode, *packing_strategy;
        int completion_only_loss; /* -1 auto, 0, 1 */
        int eval_packing;         /* -1 unset (as packing), 0, 1 */
        double eval_fraction;
        int max_length, pad_to_multiple_of;
        int max_prompt_length, max_completion_length; /* preference data; 0 = off */
        int packing, padding_free, assistant_only_loss, shuffle, skip_bad_rows;
    } data;
    struct {
        const char *optimizer, *dtype, *lr_scheduler_type, *save_strategy;
        const char *resume_from_checkpoint; /* NULL when unset */
        double learning_rate, min_lr_rate, warmup_ratio, num_train_epochs, max_grad_norm, weight_decay;
        double router_aux_loss_coef; /* -1 when unset (the model config's) */
        long max_steps, warmup_steps, logging_steps, eval_steps, save_steps;
        int per_device_train_batch_size, per_device_eval_batch_size, gradient_accumulation_steps;
        int save_total_limit;
        const char *save_dtype;             /* auto|fp32|bf16|fp16 */
        int64_t save_max_shard_bytes;       /* save_max_shard_size, parsed */
        int report_png, report_tensorboard; /* report_to */
        int ddp_timeout;                    /* seconds */
        int ddp_shared_memory;              /* plain DP's gradients in shared memory (CPU, one node) */
        int bf16_fallback_fp32;             /* bf16_fallback = fp32 (1) or rounded (0) */
    } train;
    struct {
        int server; /* mode = server */
        const char *server_url;
        double temperature, top_p, min_p, repetition_penalty;
        int top_k, sleep, log_completions;
        int ds3_gather_for_generation; /* zero3: 1 the whole model per phase, 0 a layer at a time */
        /* the engine's pool and step budget (ctrl_engine_config_from) */
        long kv_cache_bytes; /* 0: gpu_memory_utilization of the memory */
        double gpu_memory_utilization;
        int block_size, max_num_seqs, max_num_batched_tokens;
        int kv_cache_dtype; /* -1 auto (the model's compute dtype), 0 fp32, 1 bf16 */
        int decode_threads; /* 0 every thread (generate/decode_threads.h), else OpenMP threads of a step */
    } generation;
    struct {
        int enabled, r, use_rslora, use_dora, nf4; /* nf4: quantization = nf4 */
        int lora_bias;                             /* PEFT's lora_bias: lora_B has a bias */
        int ensure_weight_tying; /* PEFT's: a tied table in modules_to_save trained once, both its uses */
        int embed_bf16;          /* embedding_dtype: 0 fp32, 1 bf16, 2 auto */
        double lora_alpha, lora_dropout;
        const char *init_lora_weights; /* true, false, gaussian */
        const char *adapter_path;      /* NULL when unset */
        unsigned target_bits;          /* bit k: projection k (q, k, v, o, gate, up, down, qkv, gate_up) */
        unsigned param_bits; /* target_parameters: bit 0 experts.gate_up_proj, 1 experts.down_proj */
        int all_linear, save_embed_tokens, save_lm_head, save_score; /* save_score: PEFT SEQ_CLS */
        /* target_modules_regex, exclude_modules(_regex), layers_to_transform, layers_pattern,
         * rank_pattern and alpha_pattern, checked and held as a LoRA config's fields (settings_peft.c;
         * NULL when none is set): the rest of it is unused */
        struct ctrl_lora_config *choices;
    } peft;
    struct {
        const char *path; /* NULL when unset */
        int bf16;         /* [teacher] dtype = bf16 */
    } teacher;
    struct {
        long reduce_bucket_size;   /* floats (ZeRO's gradient buckets); -1: auto (hidden^2) */
        long prefetch_bucket_size; /* floats (zero3's gathers started ahead); -1: auto (0.9 x hidden^2) */
        int overlap_comm;          /* zero2/zero3: reductions left in flight during the backward */
        const char *offload_dir;   /* offload_activations on the CPU: the file's directory (NULL: unset) */
        int offload_overlap;       /* offload_optimizer: the host step overlapped with the next forward */
        long
            param_persistence_threshold; /* zero3: elements; views below kept whole; -1: auto (10 x hidden) */
    } memory;
} ctrl_run_settings;

const ctrl_run_plugins *ctrl_config_plugins(const ctrl_config *cfg);
const ctrl_run_settings *ctrl_config_settings(const ctrl_config *cfg);

/* Parses `path` (iniparser), applies `overrides` ("section.key=value", from --set), and validates
 * every section and key against the core's option tables and the options of the plugins the
 * config selects (which must be in `reg`). Any problem is CTRL_ERR_CONFIG (CTRL_ERR_IO for an
 * unreadable file) with a message naming file:line and the key, and a did-you-mean where one fits.
 * Defaults are filled in; the selected plugins and the typed settings are resolved
 * (ctrl_config_plugins, ctrl_config_settings). */
ctrl_status ctrl_config_load(const char *path, const char *const *overrides, int n_overrides,
                             const ctrl_registry *reg, ctrl_config **out);
void ctrl_config_free(ctrl_config *cfg);

/* Writes the effective config (every section in use, defaults filled in) as INI. */
ctrl_status ctrl_config_write_effective(const ctrl_config *cfg, const char *path);

/* The core's own sections, NULL-terminated: {"run", run_options}, ... */
typedef struct ctrl_config_section {
    const char *name;
    const char *doc;
    const ctrl_option *options;
} ctrl_config_section;
const ctrl_config_section *ctrl_config_core_sections(void);

/* Prints one option table as aligned text (for `ctrl plugins describe`). */
void ctrl_option_table_print(FILE *out, const ctrl_option *options);

/* Writes docs/config-reference.md's content: core sections, then every plugin's options. */
ctrl_status ctrl_config_reference_write(const ctrl_registry *reg, FILE *out);

#endif
