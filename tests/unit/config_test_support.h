/* Shared by the config tests: a registry of stand-in plugins (descriptors with option tables and
 * empty vtables, enough for validation), and a helper that writes an INI file and loads it. */
#ifndef CTRL_TEST_CONFIG_SUPPORT_H
#define CTRL_TEST_CONFIG_SUPPORT_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <ctrl/ctrl.h>

#include "config/config_load.h"
#include "registry/registry.h"

static const ctrl_trainer_ops t_trainer_ops = {.size = sizeof(ctrl_trainer_ops)};
static const ctrl_optimizer_ops t_optimizer_ops = {.size = sizeof(ctrl_optimizer_ops)};
static const ctrl_attention_ops t_attention_ops = {.size = sizeof(ctrl_attention_ops)};
static const ctrl_memory_ops t_memory_ops = {.size = sizeof(ctrl_memory_ops)};
static const ctrl_reward_ops t_reward_ops = {.size = sizeof(ctrl_reward_ops)};

static const ctrl_option t_dpo_options[] = {
    {.key = "beta",
     .type = CTRL_OPT_FLOAT,
     .default_value = "0.1",
     .flags = CTRL_OPT_HAS_MIN,
     .min = 0,
     .doc = "KL strength."},
    CTRL_OPTION_END,
};
static const ctrl_option t_adamw_options[] = {
    {.key = "adam_beta1",
     .type = CTRL_OPT_FLOAT,
     .default_value = "0.9",
     .flags = CTRL_OPT_HAS_MIN | CTRL_OPT_HAS_MAX | CTRL_OPT_MAX_OPEN,
     .min = 0,
     .max = 1,
     .doc = "b1"},
    CTRL_OPTION_END,
};
static const ctrl_option t_flash_options[] = {
    {.key = "block_q",
     .type = CTRL_OPT_INT,
     .default_value = "64",
     .flags = CTRL_OPT_HAS_MIN | CTRL_OPT_HAS_MAX,
     .min = 16,
     .max = 256,
     .doc = "query tile"},
    CTRL_OPTION_END,
};
static const ctrl_option t_length_options[] = {
    {.key = "target_length",
     .type = CTRL_OPT_INT,
     .default_value = "20",
     .flags = CTRL_OPT_HAS_MIN,
     .min = 0,
     .doc = "target"},
    {.key = "unit",
     .type = CTRL_OPT_CHOICE,
     .default_value = "chars",
     .choices = "chars|tokens",
     .doc = "unit"},
    CTRL_OPTION_END,
};

#define T_PLUGIN(var, k, n, opts, ops_)                                                                      \
    static const ctrl_plugin var = {CTRL_PLUGIN_HEADER, .kind = k,       .name = n,  .version = "1",         \
                                    .summary = n,       .options = opts, .ops = ops_}
T_PLUGIN(t_sft, CTRL_KIND_TRAINER, "sft", NULL, &t_trainer_ops);
T_PLUGIN(t_dpo, CTRL_KIND_TRAINER, "dpo", t_dpo_options, &t_trainer_ops);
T_PLUGIN(t_adamw, CTRL_KIND_OPTIMIZER, "adamw", t_adamw_options, &t_optimizer_ops);
T_PLUGIN(t_sgd, CTRL_KIND_OPTIMIZER, "sgd", NULL, &t_optimizer_ops);
T_PLUGIN(t_flash, CTRL_KIND_ATTENTION, "flash", t_flash_options, &t_attention_ops);
T_PLUGIN(t_eager, CTRL_KIND_ATTENTION, "eager", NULL, &t_attention_ops);
T_PLUGIN(t_paged, CTRL_KIND_ATTENTION, "paged", NULL, &t_attention_ops);
T_PLUGIN(t_ckpt, CTRL_KIND_MEMORY, "checkpointing", NULL, &t_memory_ops);
T_PLUGIN(t_offload, CTRL_KIND_MEMORY, "offload", NULL, &t_memory_ops);
T_PLUGIN(t_length, CTRL_KIND_REWARD, "length", t_length_options, &t_reward_ops);

static ctrl_registry *test_registry(void) {
    static const ctrl_plugin *const list[] = {&t_sft,   &t_dpo,  &t_adamw,   &t_sgd,    &t_flash, &t_eager,
                                              &t_paged, &t_ckpt, &t_offload, &t_length, NULL};
    ctrl_registry *reg = NULL;
    if (ctrl_registry_create(&reg) != CTRL_OK) return NULL;
    if (ctrl_registry_add_list(reg, list, "<test>") != CTRL_OK) {
        fprintf(stderr, "test registry: %s\n", ctrl_error_message());
        ctrl_registry_destroy(reg);
        return NULL;
    }
    return reg;
}

/* Writes `text` to a fresh file named `name` in a temp dir and returns its path (static buffer). */
static const char *write_ini(const char *name, const char *text, size_t len) {
    static char dir[256];
    static char path[512];
    if (!dir[0]) {
        snprintf(dir, sizeof dir, "/tmp/ctrl-config-test-XXXXXX");
        if (!mkdtemp(dir)) return NULL;
    }
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f) return NULL;
    fwrite(text, 1, len ? len : strlen(text), f);
    fclose(f);
    return path;
}

/* A valid base config that cases extend. */
#define BASE_INI "[run]\ntrainer = sft\n[model]\npath = m\n[train]\noptimizer = adamw\n"

#endif
