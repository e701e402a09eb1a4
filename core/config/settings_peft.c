/* [peft]'s spellings of PEFT's other choices of modules and per-module rank / alpha (lora_match.c),
 * checked once into a LoRA config's fields (the run's settings hold it; train_lora.c copies them):
 *   target_modules_regex   target_modules as PEFT's string: re.fullmatch on each module's name
 *   exclude_modules        a list of names (matched as target_modules' entries)
 *   exclude_modules_regex  exclude_modules as PEFT's string
 *   layers_to_transform    a list of layer indices; layers_pattern: a list of names
 *   rank_pattern / alpha_pattern  JSON objects {"pattern": number}, as adapter_config.json holds them
 *   trainable_token_indices  a list of token ids (rows of the input embedding trained beside the adapters);
 *   trainable_token_indices_lm_head: rows of an untied LM head */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/config_internal.h"
#include "model/lora.h"
#include "model/peft.h"

static const char *const keys[] = {
    "target_modules_regex", "exclude_modules",         "exclude_modules_regex",
    "layers_to_transform",  "layers_pattern",          "rank_pattern",
    "alpha_pattern",        "trainable_token_indices", "trainable_token_indices_lm_head"};

/* Key k's entries into c (where: "FILE:LINE: [peft] KEY"). */
static ctrl_status read_key(const config_entry *e, int k, ctrl_lora_config *c, const char *where) {
    char item[256];
    const char *pos = e->value;
    int r;
    switch (k) {
    case 0: return ctrl_lora_set_target_regex(c, e->value, where);
    case 2: return ctrl_lora_set_exclude_regex(c, e->value, where);
    case 5: return ctrl_peft_patterns_from_json(c, e->value, 0, where);
    case 6: return ctrl_peft_patterns_from_json(c, e->value, 1, where);
    default: break;
    }
    while ((r = config_list_next(&pos, item, sizeof item)) != 0) {
        if (r < 0)
            return ctrl_error_set(CTRL_ERR_CONFIG, "%s: an entry longer than %zu bytes", where, sizeof item);
        char *end = NULL;
        const int number = k == 3 || k >= 7; /* a layer index, a token id */
        const long at = number ? strtol(item, &end, 10) : 0;
        if (number && (end == item || *end))
            return ctrl_error_set(CTRL_ERR_CONFIG, "%s: '%s' is not a %s", where, item,
                                  k == 3 ? "layer index" : "token id");
        const ctrl_status st = k == 1   ? ctrl_lora_add_exclude(c, item, where)
                               : k == 3 ? ctrl_lora_add_layer(c, at, where)
                               : k == 7 ? ctrl_lora_add_token(c, at, where)
                               : k == 8 ? ctrl_lora_add_head_token(c, at, where)
                                        : ctrl_lora_add_layers_pattern(c, item, where);
        if (st != CTRL_OK) return st;
    }
    return CTRL_OK;
}

ctrl_status settings_read_peft_choices(const ctrl_config *cfg, ctrl_run_settings *s) {
    free(s->peft.choices);
    s->peft.choices = NULL;
    int any = 0;
    for (size_t k = 0; k < sizeof keys / sizeof *keys; k++) {
        any |= config_find(cfg, "peft", keys[k]) != NULL;
        config_note_read(cfg, "peft", keys[k]);
    }
    if (!any && !s->peft.lora_bias) return CTRL_OK;
    ctrl_lora_config *c = calloc(1, sizeof *c);
    if (!c) return ctrl_error_set(CTRL_ERR_NOMEM, "[peft]: out of memory");
    /* what ctrl_lora_check_choices weighs these against (the run's config is built from the same settings) */
    c->all_linear = s->peft.all_linear, c->n_params = s->peft.param_bits != 0;
    c->lora_bias = s->peft.lora_bias, c->use_dora = s->peft.use_dora;
    c->init = ctrl_lora_init_named(s->peft.init_lora_weights);
    ctrl_status st = CTRL_OK;
    char where[700];
    const config_entry *tm = config_find(cfg, "peft", "target_modules"),
                       *rx = config_find(cfg, "peft", keys[0]);
    if (tm && rx && strcmp(tm->where, "default") != 0)
        st = ctrl_error_set(CTRL_ERR_CONFIG,
                            "%s: [peft] target_modules_regex set together with target_modules (%s): PEFT's "
                            "target_modules is either a list or a regular expression; remove one",
                            rx->where, tm->where);
    if (rx) c->all_linear = 0; /* the regular expression replaces the list */
    for (size_t k = 0; k < sizeof keys / sizeof *keys && st == CTRL_OK; k++) {
        const config_entry *e = config_find(cfg, "peft", keys[k]);
        if (!e) continue;
        snprintf(where, sizeof where, "%s: [peft] %s", e->where, keys[k]);
        st = read_key(e, (int)k, c, where);
    }
    for (int h = 0; h < 2 && st == CTRL_OK; h++) { /* the embedding's rows, the head's: PEFT refuses both */
        const config_entry *tt = config_find(cfg, "peft", keys[7 + h]);
        if (tt && (h ? s->peft.save_lm_head : s->peft.save_embed_tokens))
            st = ctrl_error_set(CTRL_ERR_CONFIG,
                                "%s: [peft] %s with modules_to_save = %s (%s): the table is trained in full "
                                "already; choose one",
                                tt->where, keys[7 + h], h ? "lm_head" : "embed_tokens",
                                ctrl_config_where(cfg, "peft", "modules_to_save"));
    }
    if (st == CTRL_OK) { /* (lora_bias's refusals are the likeliest: at its line) */
        snprintf(where, sizeof where, "%s: [peft]",
                 s->peft.lora_bias ? ctrl_config_where(cfg, "peft", "lora_bias") : cfg->file_name);
        st = ctrl_lora_check_choices(c, where);
    }
    if (st != CTRL_OK || !any) {
        free(c);
        return st;
    }
    s->peft.choices = c;
    return CTRL_OK;
}
