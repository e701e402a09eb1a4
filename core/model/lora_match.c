/* Which modules get an adapter, and with which rank and alpha, as PEFT decides it (peft 0.21:
 * tuners_utils.check_target_module_exists, utils.other.get_pattern_key), for a module named
 * model.layers.<N>.<module> (its name in the base model, which PEFT matches):
 *   1. exclude_modules: a string is re.fullmatch'ed; a list's entries match as target_modules' do.
 *   2. target_modules: a string (not all-linear) is re.fullmatch'ed, and that decides; a list entry
 *      equal to the whole name decides too; otherwise an entry the name ends with ("." + entry; all-
 *      linear: each linear layer's last name) selects it, subject to
 *   3. layers_to_transform: the layer index read from the name by re.match(r"(?:^|.*?\.)P\.(?P<idx>\d+)\.")
 *      for each layers_pattern entry P (the first that matches), or by r".*?\.[^.]*\.(?P<idx>\d+)\."
 *      without one, must be listed.
 *   4. rank_pattern / alpha_pattern: the first key (in the file's order) for which
 *      re.match(r"(.*\.)?(KEY)$", name) matches gives r / lora_alpha.
 * The expressions are PEFT's own, run by PCRE2 (UTF, Unicode properties: Python's str patterns). */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <math.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/lora.h"

/* PEFT's rule for a list entry: the module's name is the entry or ends with "." + entry. */
static int name_matches(const char *full, const char *entry) {
    const size_t nf = strlen(full), ne = strlen(entry);
    if (nf == ne) return !strcmp(full, entry);
    return nf > ne && full[nf - ne - 1] == '.' && !strcmp(full + nf - ne, entry);
}

static void module_name(char *out, size_t n, int layer, const char *suffix) {
    snprintf(out, n, "model.layers.%d.%s", layer, suffix);
}

/* Whether one of the n entries of `list` matches model.layers.<layer>.<suffix>. */
static int listed(const char (*list)[96], int n, int layer, const char *suffix) {
    char full[128];
    module_name(full, sizeof full, layer, suffix);
    for (int i = 0; i < n; i++)
        if (name_matches(full, list[i])) return 1;
    return 0;
}

/* Whether entry `name` can name `full` ("self_attn.q_proj") in some layer: as a suffix of
 * model.layers.N.<full>, or as a full name model.layers.N.<full>. */
static int can_name(const char *name, const char *full) {
    return name_matches(full, name) ||
           (strlen(name) > strlen(full) && name_matches(name, full) && !strncmp(name, "model.layers.", 13));
}

static pcre2_code *compile(const char *pattern, char *err, size_t err_n) {
    int code;
    PCRE2_SIZE at;
    pcre2_code *re =
        pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &code, &at, NULL);
    if (!re && err) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(code, msg, sizeof msg);
        snprintf(err, err_n, "not a valid regular expression at offset %zu: %s", (size_t)at, (char *)msg);
    }
    return re;
}

/* Backtracking steps one match may take: a module name is short, so an expression that needs more is
 * pathological (nested quantifiers in a stranger's adapter_config.json); it is refused, not run for
 * minutes as Python's re would. */
#define MATCH_LIMIT 200000

/* re.match (anchored at the start; end_too: re.fullmatch) of `pattern` on `text`: 1, 0, or -1 with the
 * error set when it cannot be run (the setters refuse what does not compile; MATCH_LIMIT). Group "idx",
 * if asked and matched, into *idx. */
static int re_match(const char *pattern, const char *text, int end_too, long *idx) {
    char err[400];
    pcre2_code *re = compile(pattern, err, sizeof err);
    if (!re) return ctrl_error_set(CTRL_ERR_CONFIG, "LoRA: '%s': %s", pattern, err), -1;
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(re, NULL);
    pcre2_match_context *mc = pcre2_match_context_create(NULL);
    if (mc) pcre2_set_match_limit(mc, MATCH_LIMIT);
    const uint32_t opts = PCRE2_ANCHORED | (end_too ? PCRE2_ENDANCHORED : 0);
    int rc =
        md && mc ? pcre2_match(re, (PCRE2_SPTR)text, strlen(text), 0, opts, md, mc) : PCRE2_ERROR_NOMEMORY;
    if (rc >= 0 && idx) {
        PCRE2_UCHAR num[32];
        PCRE2_SIZE len = sizeof num;
        *idx = pcre2_substring_copy_byname(md, (PCRE2_SPTR) "idx", num, &len) == 0 && len < 10
                   ? strtol((char *)num, NULL, 10)
                   : -1;
    }
    if (rc < 0 && rc != PCRE2_ERROR_NOMATCH) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(rc, msg, sizeof msg);
        ctrl_error_set(CTRL_ERR_CONFIG, "LoRA: the regular expression '%s' on the module name %s: %s",
                       pattern, text, (char *)msg);
    }
    pcre2_match_context_free(mc);
    pcre2_match_data_free(md);
    pcre2_code_free(re);
    return rc >= 0 ? 1 : rc == PCRE2_ERROR_NOMATCH ? 0 : -1;
}

/* The layer index PEFT reads from `full` for layers_to_transform (-1: none), or -2 on an error. */
static long layer_index(const ctrl_lora_config *c, const char *full) {
    long idx = -1;
    if (c->n_layers_pattern == 0)
        return re_match(".*?\\.[^.]*\\.(?P<idx>\\d+)\\.", full, 0, &idx) < 0 ? -2 : idx;
    for (int i = 0; i < c->n_layers_pattern; i++) {
        char p[256];
        snprintf(p, sizeof p, "(?:^|.*?\\.)%s\\.(?P<idx>\\d+)\\.", c->layers_pattern[i]);
        const int hit = re_match(p, full, 0, &idx);
        if (hit != 0) return hit < 0 ? -2 : idx;
    }
    return -1;
}

/* 1 when exclude_modules names `full`, 0 when not, -1 on an error. */
static int excluded(const ctrl_lora_config *c, const char *full) {
    if (c->exclude_regex[0]) return re_match(c->exclude_regex, full, 1, NULL);
    for (int i = 0; i < c->n_exclude; i++)
        if (name_matches(full, c->exclude[i])) return 1;
    return 0;
}

/* 1 when PEFT puts an adapter on `full` (model.layers.<layer>.<suffix>), 0 when not, -1 on an error. */
static int targets(const ctrl_lora_config *c, int layer, const char *suffix, const char *full) {
    const int ex = excluded(c, full);
    if (ex != 0) return ex < 0 ? -1 : 0;
    if (c->target_regex[0]) return re_match(c->target_regex, full, 1, NULL);
    for (int i = 0; i < c->n_targets; i++)
        if (!strcmp(full, c->targets[i])) return 1; /* named whole: layers_to_transform does not apply */
    if (!c->all_linear && !listed(c->targets, c->n_targets, layer, suffix)) return 0;
    if (c->n_layers == 0) return 1;
    const long idx = layer_index(c, full);
    if (idx == -2) return -1;
    for (int i = 0; idx >= 0 && i < c->n_layers; i++)
        if (c->layers[i] == idx) return 1;
    return 0;
}

/* The value of the first pattern whose key matches `full` into *out (else `fallback`). */
static ctrl_status pattern_value(const ctrl_lora_pattern *p, int n, const char *full, double fallback,
                                 double *out) {
    char re[300];
    *out = fallback;
    for (int i = 0; i < n; i++) {
        snprintf(re, sizeof re, "(.*\\.)?(%s)$", p[i].key);
        const int hit = re_match(re, full, 0, NULL);
        if (hit < 0) return CTRL_ERR_CONFIG;
        if (hit) {
            *out = p[i].value;
            break;
        }
    }
    return CTRL_OK;
}

ctrl_status ctrl_lora_module_choice(const ctrl_lora_config *c, int layer, int module, int *targeted,
                                    int *rank, float *scale) {
    char full[128];
    module_name(full, sizeof full, layer, ctrl_lora_module_names[module]);
    const int t = targets(c, layer, ctrl_lora_module_names[module], full);
    if (t < 0) return CTRL_ERR_CONFIG;
    *targeted = t, *rank = 0, *scale = 0;
    if (!t) return CTRL_OK;
    double r, alpha;
    ctrl_status st = pattern_value(c->rank_pattern, c->n_rank_pattern, full, c->r, &r);
    if (st == CTRL_OK) st = pattern_value(c->alpha_pattern, c->n_alpha_pattern, full, c->lora_alpha, &alpha);
    if (st != CTRL_OK) return st;
    *rank = (int)r, *scale = (float)(c->use_rslora ? alpha / sqrt(r) : alpha / r);
    return CTRL_OK;
}

int ctrl_lora_targets(const ctrl_lora_config *c, int layer, int module) {
    int t, r;
    float s;
    return ctrl_lora_module_choice(c, layer, module, &t, &r, &s) == CTRL_OK ? t : -1;
}

int ctrl_lora_max_rank(const ctrl_lora_config *c) {
    int r = c->r;
    for (int i = 0; i < c->n_rank_pattern; i++)
        r = c->rank_pattern[i].value > r ? (int)c->rank_pattern[i].value : r;
    return r;
}

ctrl_status ctrl_lora_add_target(ctrl_lora_config *c, const char *name, const char *where) {
    if (!strcmp(name, "all-linear")) {
        c->all_linear = 1;
        return CTRL_OK;
    }
    int known = 0; /* the entry must name one of the projections (of some layer) */
    for (int t = 0; t < LORA_N_MODULES && !known; t++) {
        const char *full = ctrl_lora_module_names[t];
        known = can_name(name, full) || !strcmp(name, strchr(full, '.') + 1);
    }
    if (!known)
        return ctrl_error_set(
            CTRL_ERR_CONFIG,
            "%s: target_modules entry '%s' names no linear layer LoRA can adapt here (q_proj, "
            "k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj, Phi-3's fused qkv_proj and "
            "gate_up_proj, a full name such as model.layers.0.self_attn.q_proj, or all-linear)",
            where, name);
    if (c->n_targets == CTRL_LORA_MAX_TARGETS || strlen(name) >= sizeof c->targets[0])
        return ctrl_error_set(CTRL_ERR_CONFIG, "%s: too many or too long target_modules entries", where);
    snprintf(c->targets[c->n_targets++], sizeof c->targets[0], "%s", name);
    return CTRL_OK;
}

/* CTRL_OK when `pattern` compiles, else an error naming `where` and `entry` (what the user wrote, of
 * which PEFT makes `pattern`). */
static ctrl_status check_regex(const char *pattern, const char *entry, const char *where) {
    char err[400];
    pcre2_code *re = compile(pattern, err, sizeof err);
    if (!re)
        return ctrl_error_set(CTRL_ERR_CONFIG, "%s: '%s': %s%s%s", where, entry, err,
                              entry == pattern ? "" : " in ", entry == pattern ? "" : pattern);
    pcre2_code_free(re);
    return CTRL_OK;
}

/* A regular expression into dst[n], refused by `where` when too long or invalid. */
static ctrl_status set_regex(char *dst, size_t n, const char *pattern, const char *where) {
    if (strlen(pattern) >= n)
        return ctrl_error_set(CTRL_ERR_CONFIG, "%s: longer than %zu bytes", where, n - 1);
    const ctrl_status st = check_regex(pattern, pattern, where);
    if (st == CTRL_OK) snprintf(dst, n, "%s", pattern);
    return st;
}

ctrl_status ctrl_lora_set_target_regex(ctrl_lora_config *c, const char *pattern, const char *where) {
    return set_regex(c->target_regex, sizeof c->target_regex, pattern, where);
}

ctrl_status ctrl_lora_set_exclude_regex(ctrl_lora_config *c, const char *pattern, const char *where) {
    return set_regex(c->exclude_regex, sizeof c->exclude_regex, pattern, where);
}

ctrl_status ctrl_lora_add_exclude(ctrl_lora_config *c, const char *name, const char *where) {
    if (c->n_exclude == CTRL_LORA_MAX_PATTERNS || strlen(name) >= sizeof c->exclude[0] || !name[0])
        return ctrl_error_set(CTRL_ERR_CONFIG, "%s: empty, too many or too long exclude_modules entries",
                              where);
    snprintf(c->exclude[c->n_exclude++], sizeof c->exclude[0], "%s", name);
    return CTRL_OK;
}

ctrl_status ctrl_lora_add_layer(ctrl_lora_config *c, long layer, const char *where) {
    if (layer < 0 || layer > 1000000)
        return ctrl_error_set(CTRL_ERR_CONFIG, "%s: layer %ld: must be a layer index >= 0", where, layer);
    if (c->n_layers == CTRL_LORA_MAX_LAYERS)
        return ctrl_error_set(CTRL_ERR_CONFIG, "%s: more than %d layers_to_transform entries", where,
                              CTRL_LORA_MAX_LAYERS);
    c->layers[c->n_layers++] = (int)layer;
    return CTRL_OK;
}

ctrl_status ctrl_lora_add_layers_pattern(ctrl_lora_config *c, const char *pattern, const char *where) {
    char p[256];
    if (c->n_layers_pattern == 8 || strlen(pattern) >= sizeof c->layers_pattern[0] || !pattern[0])
        return ctrl_error_set(CTRL_ERR_CONFIG, "%s: empty, too long or more than 8 layers_pattern entries",
                              where);
    snprintf(p, sizeof p, "(?:^|.*?\\.)%s\\.(?P<idx>\\d+)\\.", pattern);
    const ctrl_status st = check_regex(p, pattern, where);
    if (st != CTRL_OK) return st;
    snprintf(c->layers_pattern[c->n_layers_pattern++], sizeof c->layers_pattern[0], "%s", pattern);
    return CTRL_OK;
}

static ctrl_status add_pattern(ctrl_lora_pattern *list, int *n, const char *key, double value, double lo,
                               const char *what, const char *where) {
    char p[300];
    if (*n == CTRL_LORA_MAX_PATTERNS || strlen(key) >= sizeof list->key)
        return ctrl_error_set(CTRL_ERR_CONFIG, "%s: more than %d entries, or a key longer than %zu bytes",
                              where, CTRL_LORA_MAX_PATTERNS, sizeof list->key - 1);
    if (!isfinite(value) || value < lo || (lo >= 1 && (value != floor(value) || value > 1e6)))
        return ctrl_error_set(CTRL_ERR_CONFIG, "%s: '%s': %g is not a valid %s", where, key, value, what);
    snprintf(p, sizeof p, "(.*\\.)?(%s)$", key);
    const ctrl_status st = check_regex(p, key, where);
    if (st != CTRL_OK) return st;
    snprintf(list[*n].key, sizeof list->key, "%s", key);
    list[(*n)++].value = value;
    return CTRL_OK;
}

ctrl_status ctrl_lora_add_rank_pattern(ctrl_lora_config *c, const char *key, double r, const char *where) {
    return add_pattern(c->rank_pattern, &c->n_rank_pattern, key, r, 1, "rank (a whole number >= 1)", where);
}

ctrl_status ctrl_lora_add_alpha_pattern(ctrl_lora_config *c, const char *key, double alpha,
                                        const char *where) {
    return add_pattern(c->alpha_pattern, &c->n_alpha_pattern, key, alpha, 0, "lora_alpha (>= 0)", where);
}

/* init_lora_weights' values, as [peft] and adapter_config.json spell them */
static const char *const init_names[] = {
    [CTRL_LORA_INIT_DEFAULT] = "true", [CTRL_LORA_INIT_GAUSSIAN] = "gaussian",
    [CTRL_LORA_INIT_NONE] = "false",   [CTRL_LORA_INIT_PISSA] = "pissa",
    [CTRL_LORA_INIT_OLORA] = "olora",  [CTRL_LORA_INIT_ORTHOGONAL] = "orthogonal"};

ctrl_lora_init ctrl_lora_init_named(const char *name) {
    for (int i = 0; i < (int)(sizeof init_names / sizeof *init_names); i++)
        if (!strcmp(name, init_names[i])) return (ctrl_lora_init)i;
    return CTRL_LORA_INIT_DEFAULT;
}

const char *ctrl_lora_init_name(ctrl_lora_init init) { return init_names[init]; }

void ctrl_lora_copy_choices(ctrl_lora_config *dst, const ctrl_lora_config *src) {
    memcpy(dst->target_regex, src->target_regex, sizeof dst->target_regex);
    memcpy(dst->exclude_regex, src->exclude_regex, sizeof dst->exclude_regex);
    dst->n_exclude = src->n_exclude, dst->n_layers = src->n_layers,
    dst->n_layers_pattern = src->n_layers_pattern;
    memcpy(dst->exclude, src->exclude, sizeof dst->exclude);
    memcpy(dst->layers, src->layers, sizeof dst->layers);
    memcpy(dst->layers_pattern, src->layers_pattern, sizeof dst->layers_pattern);
    dst->n_rank_pattern = src->n_rank_pattern, dst->n_alpha_pattern = src->n_alpha_pattern;
    memcpy(dst->rank_pattern, src->rank_pattern, sizeof dst->rank_pattern);
    memcpy(dst->alpha_pattern, src->alpha_pattern, sizeof dst->alpha_pattern);
    dst->n_tokens = src->n_tokens, dst->n_head_tokens = src->n_head_tokens;
    memcpy(dst->tokens, src->tokens, sizeof dst->tokens);
    memcpy(dst->head_tokens, src->head_tokens, sizeof dst->head_tokens);
}

ctrl_status ctrl_lora_check_choices(const ctrl_lora_config *c, const char *where) {
    if ((c->target_regex[0] || c->all_linear) && (c->n_layers > 0 || c->n_layers_pattern > 0))
        return ctrl_error_set(
            CTRL_ERR_CONFIG,
            "%s: layers_to_transform / layers_pattern cannot be used when target_modules is "
            "a string (all-linear or a regular expression), as PEFT refuses",
            where);
    if (c->n_layers_pattern > 0 && c->n_layers == 0)
        return ctrl_error_set(CTRL_ERR_CONFIG,
                              "%s: layers_pattern is given without layers_to_transform (as PEFT refuses)",
                              where);
    if (c->lora_bias && (c->use_dora || c->n_params > 0 ||
                         (c->init != CTRL_LORA_INIT_DEFAULT && c->init != CTRL_LORA_INIT_NONE)))
        return ctrl_error_set(CTRL_ERR_CONFIG,
                              "%s: lora_bias with %s: PEFT allows lora_bias only without DoRA, without "
                              "target_parameters and with init_lora_weights true or false",
                              where,
                              c->use_dora       ? "use_dora"
                              : c->n_params > 0 ? "target_parameters"
                                                : "this init_lora_weights");
    if (c->n_params > 0 && (c->init == CTRL_LORA_INIT_PISSA || c->init == CTRL_LORA_INIT_OLORA))
        return ctrl_error_set(
            CTRL_ERR_UNSUPPORTED,
            "%s: init_lora_weights = %s with target_parameters (LoRA on experts): not implemented", where,
            c->init == CTRL_LORA_INIT_PISSA ? "pissa" : "olora");
    if (c->n_params > 0 && (c->n_layers > 0 || c->n_rank_pattern > 0 || c->n_alpha_pattern > 0 ||
                            c->n_exclude > 0 || c->exclude_regex[0]))
        return ctrl_error_set(
            CTRL_ERR_UNSUPPORTED,
            "%s: layers_to_transform, exclude_modules, rank_pattern and alpha_pattern are not "
            "implemented together with target_parameters (LoRA on experts)",
            where);
    return CTRL_OK;
}

static const char *const moe_param_names[LORA_MOE_N] = {"mlp.experts.gate_up_proj", "mlp.experts.down_proj"};

int ctrl_lora_targets_param(const ctrl_lora_config *c, int layer, int which) {
    return listed(c->params, c->n_params, layer, moe_param_names[which]);
}

ctrl_status ctrl_lora_add_parameter(ctrl_lora_config *c, const char *name, const char *where) {
    int known = 0;
    for (int w = 0; w < LORA_MOE_N && !known; w++) known = can_name(name, moe_param_names[w]);
    if (!known)
        return ctrl_error_set(
            CTRL_ERR_CONFIG,
            "%s: target_parameters entry '%s': only the experts' gate_up_proj and down_proj "
            "(experts.gate_up_proj, experts.down_proj) are implemented (not the router's "
            "gate.weight)",
            where, name);
    if (c->n_params == (int)(sizeof c->params / sizeof c->params[0]) || strlen(name) >= sizeof c->params[0])
        return ctrl_error_set(CTRL_ERR_CONFIG, "%s: too many or too long target_parameters entries", where);
    snprintf(c->params[c->n_params++], sizeof c->params[0], "%s", name);
    return CTRL_OK;
}

ctrl_status ctrl_lora_add_module_to_save(ctrl_lora_config *c, const char *name, const char *where) {
    if (name_matches("model.embed_tokens", name))
        c->save_embed_tokens = 1;
    else if (!strcmp(name, "lm_head"))
        c->save_lm_head = 1;
    else if (!strcmp(name, "score") || !strcmp(name, "classifier")) /* PEFT's SEQ_CLS head names */
        c->seq_cls = 1;
    else
        return ctrl_error_set(CTRL_ERR_CONFIG,
                              "%s: modules_to_save entry '%s': only embed_tokens, lm_head and a sequence "
                              "classifier's score (or classifier) can be trained in full beside the adapters",
                              where, name);
    return CTRL_OK;
}
