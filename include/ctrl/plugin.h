/* The plugin ABI. A plugin .so exports one symbol, `ctrl_plugins`, returning a NULL-terminated
 * list of descriptors; CTRL_PLUGIN_DEFINE makes it. The core checks `abi` exactly, `size` (structs
 * only grow at the end) and `signature` (build traits that change layout), then registers each
 * descriptor by (kind, name). Plugins reach the core only through the ctrl_host table they are
 * given (plugin_api.h routes ctrl_error_set, ctrl_log, ... through it); this header and the kind
 * headers declare types and header-only helpers, no function of libctrl, so a plugin imports
 * nothing from the core. */
#ifndef CTRL_PLUGIN_H
#define CTRL_PLUGIN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "log_level.h"
#include "option.h"
#include "status_code.h"
#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Bumped on any incompatible change of this header or of a kind's vtable layout. */
#define CTRL_PLUGIN_ABI 1u

/* Build traits that change struct layouts or calling conventions. A plugin built with other
 * traits than the core is refused with both signatures printed. */
#define CTRL_PLUGIN_SIGNATURE "ctrl1-lp64"

typedef enum ctrl_kind {
    CTRL_KIND_ATTENTION = 0,
    CTRL_KIND_OPTIMIZER,
    CTRL_KIND_TRAINER,
    CTRL_KIND_MEMORY,
    CTRL_KIND_REWARD,
    CTRL_KIND_COUNT,
} ctrl_kind;

/* What the core lends a plugin. Versioned by size: fields are only appended; a plugin checks
 * `size` before using a field added after the one it was built against. */
#if defined(__GNUC__)
#define CTRL_PRINTF_LIKE(fmt, args) __attribute__((format(printf, fmt, args)))
#else
#define CTRL_PRINTF_LIKE(fmt, args)
#endif

/* A reward model the core loads and runs for a plugin (ctrl_host's score_model_* entries). */
typedef struct ctrl_score_model ctrl_score_model;
/* A device's memory and the fused kernels an optimizer steps with there (ctrl_host's
 * device_kernels): pointers are the device's; every call runs in order on the device's stream and
 * to_host waits for what came before. Versioned by size (fields only appended). */
typedef struct ctrl_device_kernels {
    size_t size;
    ctrl_status (*alloc)(void **ptr, size_t bytes); /* not zeroed */
    void (*free)(void *ptr);
    ctrl_status (*fill_zero)(void *dst, size_t bytes);
    ctrl_status (*to_host)(void *dst, const void *src, size_t bytes);
    ctrl_status (*to_device)(void *dst, const void *src, size_t bytes);
    /* torch.optim.AdamW's update of n values in one pass (the formula of the adamw plugin; step
     * counts from 1). */
    ctrl_status (*adamw_step)(float *param, const float *grad, float *exp_avg, float *exp_avg_sq, int64_t n,
                              float lr, float beta1, float beta2, float eps, float weight_decay,
                              int64_t step);
    /* Appended: row-major C = alpha op(A) op(B) + beta C on the device (op(X) = X^T where
     * trans_x; leading dimensions in elements), A and B of `ab`, C of `c`: fp32 x fp32 -> fp32 or
     * bf16 x bf16 -> fp32/bf16, fp32 accumulation (the core's cuBLASLt; attention plugins). */
    ctrl_status (*gemm)(int trans_a, int trans_b, int M, int N, int K, float alpha, const void *A, int lda,
                        const void *B, int ldb, float beta, void *C, int ldc, ctrl_dtype ab, ctrl_dtype c);
} ctrl_device_kernels;

typedef struct ctrl_host {
    size_t size;
    uint32_t abi;
    void (*log)(ctrl_log_level level, const char *fmt, ...) CTRL_PRINTF_LIKE(2, 3);
    ctrl_status (*error_set)(ctrl_status status, const char *fmt, ...) CTRL_PRINTF_LIKE(2, 3);
    const char *(*config_get_string)(const ctrl_config *cfg, const char *section, const char *key);
    int64_t (*config_get_int)(const ctrl_config *cfg, const char *section, const char *key, int64_t fallback);
    double (*config_get_float)(const ctrl_config *cfg, const char *section, const char *key, double fallback);
    bool (*config_get_bool)(const ctrl_config *cfg, const char *section, const char *key, bool fallback);
    int has_cuda; /* 1 when this process can run CUDA kernels */
    /* Appended (check `size`): a declared option's validated value -- the file's, or the option
     * table's default, which is the only place a default lives, so these take none. On a key
     * without a value (not declared with a default, and absent) or of another type they return
     * 0 / false / NULL and, when *status is CTRL_OK, set it to CTRL_ERR_CONFIG with the message
     * naming [section] key; once *status is an error they read nothing. So a plugin reads all its
     * options and checks *status once. */
    const char *(*option_string)(const ctrl_config *cfg, const char *section, const char *key,
                                 ctrl_status *status);
    int64_t (*option_int)(const ctrl_config *cfg, const char *section, const char *key, ctrl_status *status);
    double (*option_float)(const ctrl_config *cfg, const char *section, const char *key, ctrl_status *status);
    bool (*option_bool)(const ctrl_config *cfg, const char *section, const char *key, ctrl_status *status);
    /* Appended: prefixes the current message with "context: " (as libctrl's ctrl_error_wrap). */
    ctrl_status (*error_wrap)(ctrl_status status, const char *fmt, ...) CTRL_PRINTF_LIKE(2, 3);
    /* Appended: reward models (the `reward_model` reward). score_model_open loads a
     * *ForSequenceClassification directory on the run's device with the run's attention plugin, its
     * tokenizer from `tokenizer` (NULL: the model directory); score_model_score writes out[i], the
     * first label's score of texts[i] -- tokenized without special tokens, read at its last non-pad
     * token, as transformers scores a padded batch -- `batch_size` texts per forward. */
    ctrl_status (*score_model_open)(const ctrl_config *cfg, const char *dir, const char *tokenizer,
                                    ctrl_score_model **out);
    ctrl_status (*score_model_score)(ctrl_score_model *m, const char *const *texts, int n, int batch_size,
                                     float *out);
    void (*score_model_close)(ctrl_score_model *m);
    /* Appended: the memory and kernels of `device` for an optimizer created there (its create()'s
     * device; its groups then hold that device's pointers); NULL for the CPU, whose memory is the
     * plugin's own, or a device this process has no backend for. */
    const ctrl_device_kernels *(*device_kernels)(ctrl_device device);
    /* Appended: the text a reward model scores for a conversational prompt, as TRL's GRPOTrainer
     * builds it: the prompt's messages (a JSON array) followed by {"role": "assistant", "content":
     * completion}, rendered with the reward model's own chat template (its tokenizer's), without a
     * generation prompt -- so the assistant's end-of-turn is there. *text is malloc'd (free it). */
    ctrl_status (*score_model_chat_text)(ctrl_score_model *m, const char *messages_json,
                                         const char *completion, char **text);
} ctrl_host;

typedef struct ctrl_plugin {
    uint32_t abi;          /* CTRL_PLUGIN_ABI as built */
    uint32_t size;         /* sizeof(ctrl_plugin) as built */
    const char *signature; /* CTRL_PLUGIN_SIGNATURE as built */
    ctrl_kind kind;
    const char *name; /* unique within its kind; [a-z0-9_]+ */
    const char *version;
    const char *summary;
    const ctrl_option *options; /* keys of its config section, or NULL */
    /* Called once after loading, before any other callback; non-OK refuses the plugin (message via
     * host->error_set). A plugin built on plugin_api.h keeps the host here (ctrl_plugin_api_init). */
    ctrl_status (*init)(const ctrl_host *host);
    /* Optional. 0 = cannot run on this host (e.g. needs CUDA); higher is preferred by `auto`. */
    int (*score)(const ctrl_host *host);
    /* The kind's vtable (ctrl_attention_ops, ...). Its first field is its own size. */
    const void *ops;
    /* Appended (the core reads it only when `size` covers it), optional: the checks of the plugin's
     * options that its table cannot declare (keys that exclude or need one another, the items of a
     * list, other sections' keys), on the validated values. The core runs it for every plugin a run
     * config selects while it validates the config -- `ctrl config check`, and every command that
     * loads a run config, before any work -- with the plugin's section (`dpo`, `reward.NAME`, ...).
     * A refusal's message starts with "[section] key" (the key whose value is refused): the core
     * prefixes where that key was set (file:line, --set, or the file for a default). create() may
     * call the same function, so a refusal reads the same either way. */
    ctrl_status (*check_options)(const ctrl_config *cfg, const char *section);
} ctrl_plugin;

/* Fills abi, size and signature; use in a designated initializer:
 *   static const ctrl_plugin p = { CTRL_PLUGIN_HEADER, .kind = CTRL_KIND_REWARD, ... }; */
#define CTRL_PLUGIN_HEADER                                                                                   \
    .abi = CTRL_PLUGIN_ABI, .size = sizeof(ctrl_plugin), .signature = CTRL_PLUGIN_SIGNATURE

#define CTRL_PLUGIN_ENTRY_SYMBOL "ctrl_plugins"

#if defined(_WIN32)
#define CTRL_PLUGIN_EXPORT __declspec(dllexport)
#else
#define CTRL_PLUGIN_EXPORT __attribute__((visibility("default")))
#endif

/* Defines the entry symbol. Built with CTRL_PLUGIN_STATIC_NAME=foo (for linking a plugin into a
 * test binary), the function is named ctrl_plugins_foo instead, so several can coexist.
 *   CTRL_PLUGIN_DEFINE(&my_reward, &my_other_reward)                                        */
#ifdef CTRL_PLUGIN_STATIC_NAME
#define CTRL_PLUGIN_CAT2(a, b) a##b
#define CTRL_PLUGIN_CAT(a, b) CTRL_PLUGIN_CAT2(a, b)
#define CTRL_PLUGIN_FN CTRL_PLUGIN_CAT(ctrl_plugins_, CTRL_PLUGIN_STATIC_NAME)
#define CTRL_PLUGIN_DEFINE(...)                                                                              \
    const ctrl_plugin *const *CTRL_PLUGIN_FN(void);                                                          \
    const ctrl_plugin *const *CTRL_PLUGIN_FN(void) {                                                         \
        static const ctrl_plugin *const list[] = {__VA_ARGS__, NULL};                                        \
        return list;                                                                                         \
    }
#else
#define CTRL_PLUGIN_DEFINE(...)                                                                              \
    CTRL_PLUGIN_EXPORT const ctrl_plugin *const *ctrl_plugins(void);                                         \
    CTRL_PLUGIN_EXPORT const ctrl_plugin *const *ctrl_plugins(void) {                                        \
        static const ctrl_plugin *const list[] = {__VA_ARGS__, NULL};                                        \
        return list;                                                                                         \
    }
#endif

typedef const ctrl_plugin *const *(*ctrl_plugins_fn)(void);

/* "attention", ... (header-only: the core and plugins use it without linking anything). */
static inline const char *ctrl_kind_name(ctrl_kind kind) {
    switch (kind) {
    case CTRL_KIND_ATTENTION: return "attention";
    case CTRL_KIND_OPTIMIZER: return "optimizer";
    case CTRL_KIND_TRAINER: return "trainer";
    case CTRL_KIND_MEMORY: return "memory";
    case CTRL_KIND_REWARD: return "reward";
    case CTRL_KIND_COUNT: break;
    }
    return "unknown";
}

#ifdef __cplusplus
}
#endif
#endif
