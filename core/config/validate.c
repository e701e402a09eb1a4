/* Validation of a whole run config before any work: every section and key against the core's
 * tables and the selected plugins' tables; types, ranges, choices, required keys and plugin
 * names. Each message names where the value came from (file:line or --set) and the key; every
 * problem found is reported, not only the first (config_problems). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/config_internal.h"

#define MAX_NAMES 256

const ctrl_option *config_find_option(const ctrl_option *opts, const char *key) {
    for (int i = 0; opts && opts[i].key; i++)
        if (!strcmp(opts[i].key, key)) return &opts[i];
    return NULL;
}

const char *config_value_or_default(const ctrl_config *cfg, const char *section, const ctrl_option *opts,
                                    const char *key) {
    config_note_read(cfg, section, key);
    config_entry *e = config_find(cfg, section, key);
    if (e) return e->value;
    const ctrl_option *o = config_find_option(opts, key);
    return o ? o->default_value : NULL;
}

static const char *where_of(const ctrl_config *cfg, const config_entry *e) {
    return e ? e->where : cfg->file_name;
}

/* A plugin name given by a key: it must be loaded, with the kind the key selects. */
ctrl_status config_check_plugin_name(const ctrl_config *cfg, const ctrl_registry *reg, ctrl_kind kind,
                                     const char *section, const char *key, const char *name,
                                     const ctrl_plugin **out) {
    const ctrl_plugin_entry *pe = ctrl_registry_find(reg, kind, name);
    if (pe) {
        *out = pe->plugin;
        return CTRL_OK;
    }
    const char *names[MAX_NAMES];
    int n = 0;
    for (int i = 0; i < ctrl_registry_count(reg) && n < MAX_NAMES; i++) {
        const ctrl_plugin *p = ctrl_registry_at(reg, i)->plugin;
        if (p->kind == kind) names[n++] = p->name;
    }
    char loaded[1024];
    ctrl_registry_names(reg, kind, loaded, sizeof loaded);
    /* transformers' TrainingArguments.optim names of the optimizers ctrl has */
    static const char *const hf_optim[][2] = {{"adamw_bnb_8bit", "adamw_8bit"},
                                              {"adamw_torch", "adamw"},
                                              {"adamw_torch_fused", "adamw"},
                                              {"adamw_hf", "adamw"}};
    const char *s = config_suggest(name, names, n);
    for (size_t i = 0; kind == CTRL_KIND_OPTIMIZER && i < sizeof hf_optim / sizeof hf_optim[0]; i++)
        if (!strcmp(name, hf_optim[i][0])) s = hf_optim[i][1];
    char hint[160] = "";
    if (s) snprintf(hint, sizeof hint, "did you mean '%s'? ", s);
    config_entry *e = config_find(cfg, section, key);
    return ctrl_error_set(
        CTRL_ERR_CONFIG, "%s: [%s] %s = '%s'%s: no %s plugin of that name is loaded (%sloaded: %s)",
        where_of(cfg, e), section, key, name, e ? "" : " (the default)", ctrl_kind_name(kind), hint, loaded);
}

static int is_core_section(const char *name) {
    for (const ctrl_config_section *s = ctrl_config_core_sections(); s->name; s++)
        if (!strcmp(s->name, name)) return 1;
    return 0;
}

const ctrl_option *config_core_table(const char *name) {
    for (const ctrl_config_section *s = ctrl_config_core_sections(); s->name; s++)
        if (!strcmp(s->name, name)) return s->options;
    return NULL;
}

void config_check_section_keys(const ctrl_config *cfg, const char *section, const ctrl_option *t1,
                               const ctrl_option *t2, const char *owner, config_problems *pr) {
    for (int i = 0; i < cfg->n; i++) {
        const config_entry *e = &cfg->entries[i];
        if (strcmp(e->section, section) != 0) continue;
        const ctrl_option *o = config_find_option(t1, e->key);
        if (!o) o = config_find_option(t2, e->key);
        if (!o) {
            const char *names[MAX_NAMES];
            int n = 0;
            for (int k = 0; t1 && t1[k].key && n < MAX_NAMES; k++) names[n++] = t1[k].key;
            for (int k = 0; t2 && t2[k].key && n < MAX_NAMES; k++) names[n++] = t2[k].key;
            const char *s = config_suggest(e->key, names, n), *trl = config_trl_name_hint(e->key);
            char hint[320] = "";
            if (trl) /* a TRL / transformers name: say what ctrl calls it */
                snprintf(hint, sizeof hint, " (TRL's %s is ctrl's %s)", e->key, trl);
            else if (s)
                snprintf(hint, sizeof hint, " (did you mean '%s'?)", s);
            else if (n == 0)
                snprintf(hint, sizeof hint, " (%s has no options)", owner);
            ctrl_error_set(CTRL_ERR_CONFIG, "%s: [%s] %s: unknown key%s", e->where, section, e->key, hint);
            config_problem_note(pr, CTRL_ERR_CONFIG);
            continue;
        }
        if (config_check_value(e, o) != CTRL_OK) config_problem_note(pr, CTRL_ERR_CONFIG);
    }
}

/* Where a section was opened: "file:line", the --set that created it, or the file alone. */
static const char *section_where(const ctrl_config *cfg, const char *section) {
    for (int s = 0; s < cfg->n_sections; s++)
        if (!strcmp(cfg->sections[s].name, section)) return cfg->sections[s].where;
    return cfg->file_name;
}

/* Missing required keys are errors; absent keys with defaults are filled in. A default that fails
 * its own table's checks is the table author's bug, reported as such rather than used. */
static ctrl_status require_and_fill(ctrl_config *cfg, const char *section, const ctrl_option *opts,
                                    const char *owner, config_problems *pr) {
    for (int i = 0; opts && opts[i].key; i++) {
        const ctrl_option *o = &opts[i];
        if (config_find(cfg, section, o->key)) continue;
        if (o->flags & CTRL_OPT_REQUIRED) {
            ctrl_error_set(CTRL_ERR_CONFIG, "%s: [%s] %s: required key is missing (%s)",
                           section_where(cfg, section), section, o->key, o->doc ? o->doc : "");
            config_problem_note(pr, CTRL_ERR_CONFIG);
            continue;
        }
        if (!o->default_value) continue;
        ctrl_status st = config_put(cfg, section, o->key, o->default_value, "default", 0);
        if (st != CTRL_OK) return st;
        if (config_check_value(config_find(cfg, section, o->key), o) != CTRL_OK)
            return ctrl_error_wrap(CTRL_ERR_PLUGIN, "%s declares an invalid default", owner);
    }
    return CTRL_OK;
}

static ctrl_status check_device(const ctrl_config *cfg) {
    config_entry *e = config_find(cfg, "run", "device");
    if (!e) return CTRL_OK;
    const char *v = e->value;
    if (!strcmp(v, "auto") || !strcmp(v, "cpu") || !strcmp(v, "cuda")) return CTRL_OK;
    if (!strncmp(v, "cuda:", 5)) {
        size_t digits = strspn(v + 5, "0123456789");
        if (digits >= 1 && digits <= 4 && !v[5 + digits]) return CTRL_OK;
    }
    return ctrl_error_set(CTRL_ERR_CONFIG, "%s: [run] device = '%s': expected auto, cpu, cuda or cuda:N",
                          e->where, v);
}

/* Options the tables accept for the design but no code implements yet are refused when turned on,
 * naming the key: a run must never silently do something other than what its config says. */
static ctrl_status check_not_implemented(const ctrl_config *cfg) {
    bool on = false;
    config_note_read(cfg, "peft", "bias"); /* read here: none is the only value implemented */
    config_entry *e = config_find(cfg, "peft", "bias");
    if (e && strcmp(e->value, "none") != 0)
        return ctrl_error_set(
            CTRL_ERR_CONFIG, "%s: [peft] bias = %s: only none is implemented (the base's biases stay frozen)",
            e->where, e->value);
    e = config_find(cfg, "peft", "enabled");
    on = false;
    const int peft_on = e && config_parse_bool(e->value, &on) == 0 && on;
    config_entry *q = config_find(cfg, "peft", "quantization");
    if (q && !strcmp(q->value, "nf4") && !peft_on) /* QLoRA: adapters over the NF4 base */
        return ctrl_error_set(CTRL_ERR_CONFIG,
                              "%s: [peft] quantization = nf4 without [peft] enabled = true: QLoRA trains "
                              "adapters over the quantized base",
                              q->where);
    config_entry *ed = config_find(cfg, "peft", "embedding_dtype");
    if (ed && !strcmp(ed->value, "bf16")) { /* the frozen embedding held in bf16 (model_embed16.c) */
        if (!peft_on)
            return ctrl_error_set(CTRL_ERR_CONFIG,
                                  "%s: [peft] embedding_dtype = bf16 without [peft] enabled = true: only a "
                                  "LoRA run's frozen embedding is held in bf16",
                                  ed->where);
        const char *dt = config_value_or_default(cfg, "train", config_core_table("train"), "dtype");
        if (!dt || strcmp(dt, "bf16") != 0)
            return ctrl_error_set(
                CTRL_ERR_CONFIG,
                "%s: [peft] embedding_dtype = bf16 needs [train] dtype = bf16 (it is %s: the "
                "fp32 products would read the rounded table)",
                ed->where, dt ? dt : "unset");
        const char *dev = config_value_or_default(cfg, "run", config_core_table("run"), "device");
        if (dev && !strncmp(dev, "cuda", 4))
            return ctrl_error_set(
                CTRL_ERR_CONFIG,
                "%s: [peft] embedding_dtype = bf16 with [run] device = %s: the embedding is "
                "held in bf16 on the CPU only",
                ed->where, dev);
        const char *strat = config_value_or_default(cfg, "memory", config_core_table("memory"), "strategies");
        char w[128];
        for (const char *pos = strat ? strat : ""; config_list_next(&pos, w, sizeof w) > 0;)
            if (!strcmp(w, "zero3")) /* its slices of the frozen base are gathered from the fp32 values */
                return ctrl_error_set(
                    CTRL_ERR_CONFIG,
                    "%s: [peft] embedding_dtype = bf16 with [memory] strategies = zero3: the "
                    "sliced embedding is gathered in fp32 (not implemented)",
                    ed->where);
        char item[64];
        for (int i = 0; i < ctrl_config_list_count(cfg, "peft", "modules_to_save"); i++) {
            const char *t = ctrl_config_list_item(cfg, "peft", "modules_to_save", i, item, sizeof item);
            if (t && !strcmp(t, "embed_tokens"))
                return ctrl_error_set(
                    CTRL_ERR_CONFIG,
                    "%s: [peft] embedding_dtype = bf16 with modules_to_save = embed_tokens: "
                    "a trained embedding stays fp32 (only a frozen one is held in bf16)",
                    ed->where);
        }
        if (config_find(cfg, "peft", "trainable_token_indices"))
            return ctrl_error_set(
                CTRL_ERR_CONFIG,
                "%s: [peft] embedding_dtype = bf16 with trainable_token_indices (%s): rows of "
                "the table are trained, so it stays fp32 (only a frozen one is held in bf16)",
                ed->where, ctrl_config_where(cfg, "peft", "trainable_token_indices"));
    }
    /* trainable_token_indices' rows are rows of the table, which zero3 gives each rank a slice of */
    const config_entry *tt = config_find(cfg, "peft", "trainable_token_indices");
    if (!tt) tt = config_find(cfg, "peft", "trainable_token_indices_lm_head");
    const char *strat = config_value_or_default(cfg, "memory", config_core_table("memory"), "strategies");
    char w[128];
    for (const char *pos = strat ? strat : ""; tt && config_list_next(&pos, w, sizeof w) > 0;)
        if (!strcmp(w, "zero3"))
            return ctrl_error_set(
                CTRL_ERR_CONFIG,
                "%s: [peft] %s with [memory] strategies = zero3: the "
                "trained rows live in the embedding table, which each rank holds a slice of "
                "(not implemented; zero1 and zero2 work)",
                tt->where, tt->key);
    /* an adapter's setting with enabled left unset (false): it would be ignored, silently -- refused; an
     * explicit enabled = false (a run switching LoRA off, --set peft.enabled=false) keeps the rest unread */
    for (const ctrl_option *o = config_core_table("peft"); !e && o && o->key; o++) {
        const config_entry *k = strcmp(o->key, "enabled") ? config_find(cfg, "peft", o->key) : NULL;
        if (k)
            return ctrl_error_set(
                CTRL_ERR_CONFIG,
                "%s: [peft] %s is set but [peft] enabled is not: the adapters' settings would "
                "be ignored (set enabled = true to train adapters, or remove it)",
                k->where, o->key);
    }
    if (!peft_on) return CTRL_OK;
    static const char *const adapter_keys[] = {"r",
                                               "lora_alpha",
                                               "target_modules",
                                               "use_rslora",
                                               "modules_to_save",
                                               "init_lora_weights",
                                               "lora_bias",
                                               "ensure_weight_tying",
                                               "use_dora",
                                               "target_parameters",
                                               "target_modules_regex",
                                               "exclude_modules",
                                               "exclude_modules_regex",
                                               "layers_to_transform",
                                               "layers_pattern",
                                               "rank_pattern",
                                               "alpha_pattern",
                                               "trainable_token_indices",
                                               "trainable_token_indices_lm_head"};
    if (config_find(cfg, "peft", "adapter_path"))
        for (size_t i = 0; i < sizeof adapter_keys / sizeof *adapter_keys; i++) {
            config_entry *k = config_find(cfg, "peft", adapter_keys[i]);
            if (k)
                return ctrl_error_set(
                    CTRL_ERR_CONFIG,
                    "%s: [peft] %s: set together with adapter_path, whose adapter_config.json "
                    "defines it; remove one",
                    k->where, adapter_keys[i]);
        }
    return CTRL_OK;
}

static ctrl_status select_plugins(const ctrl_config *cfg, const ctrl_registry *reg, config_selection *sel) {
    ctrl_status st;
    const char *name = config_value_or_default(cfg, "run", config_core_table("run"), "trainer");
    if ((st = config_check_plugin_name(cfg, reg, CTRL_KIND_TRAINER, "run", "trainer", name, &sel->trainer)))
        return st;
    name = config_value_or_default(cfg, "train", config_core_table("train"), "optimizer");
    if ((st = config_check_plugin_name(cfg, reg, CTRL_KIND_OPTIMIZER, "train", "optimizer", name,
                                       &sel->optimizer)))
        return st;
    name = config_value_or_default(cfg, "model", config_core_table("model"), "attention");
    if ((st = config_check_plugin_name(cfg, reg, CTRL_KIND_ATTENTION, "model", "attention", name,
                                       &sel->attention)))
        return st;
    /* set explicitly: checked now; the default only when loaded (a run that decodes without it
     * says so when it starts generating) */
    name = config_value_or_default(cfg, "generation", config_core_table("generation"), "attention");
    if (config_find(cfg, "generation", "attention")) {
        if ((st = config_check_plugin_name(cfg, reg, CTRL_KIND_ATTENTION, "generation", "attention", name,
                                           &sel->decoder)))
            return st;
    } else {
        const ctrl_plugin_entry *d = name ? ctrl_registry_find(reg, CTRL_KIND_ATTENTION, name) : NULL;
        sel->decoder = d ? d->plugin : NULL;
    }
    const char *list = config_value_or_default(cfg, "memory", config_core_table("memory"), "strategies");
    const char *where = where_of(cfg, config_find(cfg, "memory", "strategies"));
    char w[128];
    int r;
    for (const char *pos = list ? list : ""; (r = config_list_next(&pos, w, sizeof w)) != 0;) {
        if (r < 0)
            return ctrl_error_set(CTRL_ERR_CONFIG, "%s: [memory] strategies: a name is too long", where);
        const ctrl_plugin *p = NULL;
        if ((st = config_check_plugin_name(cfg, reg, CTRL_KIND_MEMORY, "memory", "strategies", w, &p)))
            return st;
        for (int i = 0; i < sel->n_memory; i++)
            if (sel->memory[i] == p)
                return ctrl_error_set(CTRL_ERR_CONFIG, "%s: [memory] strategies: '%s' is listed twice", where,
                                      w);
        if (sel->n_memory == CONFIG_MAX_MEMORY)
            return ctrl_error_set(CTRL_ERR_CONFIG, "%s: [memory] strategies: more than %d strategies", where,
                                  CONFIG_MAX_MEMORY);
        sel->memory[sel->n_memory++] = p;
    }
    return CTRL_OK;
}

static void owner_text(const ctrl_plugin *p, char *out, size_t cap) {
    snprintf(out, cap, "%s '%s'", ctrl_kind_name(p->kind), p->name);
}

/* output_dir defaults to runs/<config file name without directory and extension>. */
static ctrl_status default_output_dir(ctrl_config *cfg) {
    if (config_find(cfg, "run", "output_dir")) return CTRL_OK;
    const char *base = strrchr(cfg->path, '/');
    base = base ? base + 1 : cfg->path;
    char stem[256];
    snprintf(stem, sizeof stem, "%s", base);
    char *dot = strrchr(stem, '.');
    if (dot && dot != stem) *dot = '\0';
    char dir[300];
    snprintf(dir, sizeof dir, "runs/%s", stem);
    return config_put(cfg, "run", "output_dir", dir, "default", 0);
}

/* Fills the defaults of every section in use; missing required keys are noted. Stops only for a
 * plugin's invalid default or an allocation failure. */
static ctrl_status fill_defaults(ctrl_config *cfg, const config_selection *sel, config_problems *pr) {
    ctrl_status st;
    char owner[128], section[128];
    for (const ctrl_config_section *s = ctrl_config_core_sections(); s->name; s++)
        if ((st = require_and_fill(cfg, s->name, s->options, "the core", pr))) return st;
    if ((st = default_output_dir(cfg))) return st;
    const ctrl_plugin *selected[3 + CONFIG_MAX_MEMORY] = {sel->trainer, sel->optimizer, sel->attention};
    int n = 3;
    for (int i = 0; i < sel->n_memory; i++) selected[n++] = sel->memory[i];
    for (int i = 0; i < n; i++) {
        const ctrl_plugin *p = selected[i];
        snprintf(section, sizeof section, "%s%s", p->kind == CTRL_KIND_ATTENTION ? "attention." : "",
                 p->name);
        owner_text(p, owner, sizeof owner);
        if ((st = require_and_fill(cfg, section, p->options, owner, pr))) return st;
    }
    for (int i = 0; i < sel->n_rewards; i++) { /* the [reward.NAME] sections whose plugin is loaded */
        const ctrl_run_reward *rw = &sel->reward[i];
        snprintf(owner, sizeof owner, "reward '%s'", rw->plugin->name);
        if ((st = require_and_fill(cfg, rw->section, config_reward_instance_options, "the core", pr)))
            return st;
        if ((st = require_and_fill(cfg, rw->section, rw->plugin->options, owner, pr))) return st;
    }
    return CTRL_OK;
}

ctrl_status config_validate(ctrl_config *cfg, const ctrl_registry *reg) {
    ctrl_status st;
    config_problems pr = {0};
    /* 1. The core sections first: plugin selection depends on their values. */
    for (int i = 0; i < cfg->n_sections; i++) {
        const char *name = cfg->sections[i].name;
        if (is_core_section(name))
            config_check_section_keys(cfg, name, config_core_table(name), NULL, "the core", &pr);
    }
    if ((st = check_device(cfg))) config_problem_note(&pr, st);
    if ((st = check_not_implemented(cfg))) config_problem_note(&pr, st);
    config_selection *sel = &cfg->plugins;
    memset(sel, 0, sizeof *sel);
    if ((st = select_plugins(cfg, reg, sel))) {
        /* Without the selection, plugin sections cannot be judged: report what is known. */
        config_problem_note(&pr, st);
        return config_problems_report(&pr, cfg->file_name);
    }
    /* 2. Every other section belongs to a selected plugin or is a reward function. */
    for (int i = 0; i < cfg->n_sections; i++) {
        const config_section_seen *sec = &cfg->sections[i];
        if (is_core_section(sec->name)) continue;
        if (!strncmp(sec->name, "reward.", 7)) {
            const ctrl_plugin *rp = config_check_reward_section(cfg, reg, sec, &pr);
            if (rp && sel->n_rewards == CTRL_RUN_MAX_REWARDS) {
                ctrl_error_set(CTRL_ERR_CONFIG, "%s: [%s]: more than %d reward functions", sec->where,
                               sec->name, CTRL_RUN_MAX_REWARDS);
                config_problem_note(&pr, CTRL_ERR_CONFIG);
            } else if (rp) {
                sel->reward[sel->n_rewards++] =
                    (ctrl_run_reward){.section = sec->name, .name = sec->name + 7, .plugin = rp};
            }
            continue;
        }
        const ctrl_plugin *p = NULL;
        if ((st = config_plugin_section(cfg, reg, sel, sec, &p))) {
            config_problem_note(&pr, st);
            continue;
        }
        char owner[128];
        owner_text(p, owner, sizeof owner);
        config_check_section_keys(cfg, sec->name, p->options, NULL, owner, &pr);
    }
    /* 3. Required keys and defaults, core and selected plugins. */
    if ((st = fill_defaults(cfg, sel, &pr))) return st;
    if ((st = config_problems_report(&pr, cfg->file_name))) return st;
    /* 4. The plugins' own checks of the values (combinations their tables cannot declare). */
    config_check_plugin_options(cfg, sel, &pr);
    if ((st = config_problems_report(&pr, cfg->file_name))) return st;
    return config_settings_fill(cfg);
}
