/* The typed settings of a validated config (config_load.h: ctrl_run_settings): read once, after
 * the defaults are filled, so that the loops never read the config by string. Values are read
 * with ctrl_config_require_*: the option tables are the only place a default lives (a key with
 * neither a value nor a default is the table's bug, reported, not papered over here). */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <ctrl/log.h>

#include "config/config_internal.h"
#include "hub_cache.h"
#include "model/model.h"

typedef struct reader {
    const ctrl_config *cfg;
    ctrl_status st; /* the first failure (its message is kept: later reads are skipped) */
} reader;

static const char *rd_str(reader *r, const char *section, const char *key) {
    const char *v = NULL;
    if (r->st == CTRL_OK) r->st = ctrl_config_require_string(r->cfg, section, key, &v);
    return v;
}
static int64_t rd_int(reader *r, const char *section, const char *key) {
    int64_t v = 0;
    if (r->st == CTRL_OK) r->st = ctrl_config_require_int(r->cfg, section, key, &v);
    return v;
}
static double rd_float(reader *r, const char *section, const char *key) {
    double v = 0;
    if (r->st == CTRL_OK) r->st = ctrl_config_require_float(r->cfg, section, key, &v);
    return v;
}
/* 1 when the comma/space-separated list holds `word`. */
static int list_has(const char *list, const char *word) {
    const size_t n = strlen(word);
    for (const char *p = list; p && *p;) {
        while (*p == ',' || *p == ' ' || *p == '\t') p++;
        const size_t len = strcspn(p, ", \t");
        if (len == n && !strncmp(p, word, n)) return 1;
        p += len;
    }
    return 0;
}
/* A count of floats or "auto" (-1): an integer >= `least`, also written as DeepSpeed's configs
 * write them (5e7); anything else refused naming the key and where it was set. */
static long rd_floats_or_auto(reader *r, const char *section, const char *key, long least) {
    const char *v = rd_str(r, section, key);
    if (!v || !strcmp(v, "auto")) return -1;
    char *end;
    const double x = strtod(v, &end);
    if (end != v && !*end && x >= (double)least && x <= 9e15 && x == (double)(long long)x) return (long)x;
    const config_entry *e = config_find(r->cfg, section, key);
    if (r->st == CTRL_OK)
        r->st = ctrl_error_set(CTRL_ERR_CONFIG,
                               "%s: [%s] %s = %s: expected auto or a whole number of floats >= %ld (e.g. "
                               "50000000 or 5e7)",
                               e ? e->where : "default", section, key, v, least);
    return 0;
}
static int rd_bool(reader *r, const char *section, const char *key) {
    bool v = false;
    if (r->st == CTRL_OK) r->st = ctrl_config_require_bool(r->cfg, section, key, &v);
    return v;
}

/* A model named by its Hub id: the local cache's snapshot directory, written back into the config so
 * that every reader (and the effective config.ini) sees the directory. Not in the cache: left as is,
 * and the loader's message says where it was looked for. */
static ctrl_status resolve_hub_id(ctrl_config *cfg, const char *section, const char *key) {
    config_entry *e = config_find(cfg, section, key);
    char buf[4096];
    const char *dir = e ? ctrl_hub_resolve(e->value, buf, sizeof buf) : NULL;
    if (!e || dir == e->value) return CTRL_OK;
    char *v = strdup(dir);
    if (!v) return ctrl_error_set(CTRL_ERR_NOMEM, "[%s] %s: out of memory", section, key);
    CTRL_INFO("[%s] %s = %s: the local Hugging Face cache's %s", section, key, e->value, v);
    free(e->value);
    e->value = v;
    return CTRL_OK;
}

/* A split (or subset) set explicitly picks files of a folder or Hub dataset id; for one file the key
 * would do nothing: refused rather than ignored. */
static ctrl_status check_split(const ctrl_config *cfg, const char *path_key, const char *split_key) {
    const config_entry *s = config_find(cfg, "data", split_key), *p = config_find(cfg, "data", path_key);
    struct stat sb;
    if (!s || !p || !strcmp(s->where, "default") || stat(p->value, &sb) != 0 || !S_ISREG(sb.st_mode))
        return CTRL_OK;
    return ctrl_error_set(
        CTRL_ERR_CONFIG,
        "%s: [data] %s = %s: [data] %s = %s is one file; the key picks among the files of a "
        "folder or a Hub dataset id",
        s->where, split_key, s->value, path_key, p->value);
}

ctrl_status config_settings_fill(ctrl_config *cfg) {
    ctrl_status sst = check_split(cfg, "train_file", "split");
    if (sst == CTRL_OK) sst = check_split(cfg, "eval_file", "eval_split");
    const config_entry *ev = config_find(cfg, "data", "eval_file");
    struct stat esb; /* the subset serves both: refused when neither is a folder or an id */
    if (sst == CTRL_OK && (!ev || (stat(ev->value, &esb) == 0 && S_ISREG(esb.st_mode))))
        sst = check_split(cfg, "train_file", "subset");
    if (sst != CTRL_OK) return sst;
    static const char *const model_paths[][2] = {
        {"model", "path"}, {"teacher", "path"}, {"peft", "adapter_path"}};
    for (size_t i = 0; i < sizeof model_paths / sizeof model_paths[0]; i++) {
        ctrl_status st = resolve_hub_id(cfg, model_paths[i][0], model_paths[i][1]);
        if (st != CTRL_OK) return st;
    }
    reader r = {.cfg = cfg};
    ctrl_run_settings *s = &cfg->settings;
    free(s->peft.choices); /* (the settings are filled again when the config is checked again) */
    const char *mode = rd_str(&r, "generation", "mode");
    const char *only = rd_str(&r, "data", "completion_only_loss");
    const char *kv = rd_str(&r, "generation", "kv_cache_dtype");
    const char *tdtype = rd_str(&r, "teacher", "dtype");
    const char *bf16_fallback = rd_str(&r, "train", "bf16_fallback");
    const char *report = rd_str(&r, "train", "report_to");
    *s = (ctrl_run_settings){
        .run = {.trainer = rd_str(&r, "run", "trainer"),
                .output_dir = rd_str(&r, "run", "output_dir"),
                .device = rd_str(&r, "run", "device"),
                .log_level = rd_str(&r, "run", "log_level"),
                .seed = (uint64_t)rd_int(&r, "run", "seed")},
        .model = {.path = rd_str(&r, "model", "path")},
        .data = {.train_file = ctrl_config_get_string(cfg, "data", "train_file"),
                 .eval_file = ctrl_config_get_string(cfg, "data", "eval_file"),
                 .chat_template_path = ctrl_config_get_string(cfg, "data", "chat_template_path"),
                 .split = rd_str(&r, "data", "split"),
                 .eval_split = rd_str(&r, "data", "eval_split"),
                 .subset = ctrl_config_get_string(cfg, "data", "subset"),
                 .dataset_text_field = rd_str(&r, "data", "dataset_text_field"),
                 .messages_field = rd_str(&r, "data", "messages_field"),
                 .prompt_field = rd_str(&r, "data", "prompt_field"),
                 .completion_field = rd_str(&r, "data", "completion_field"),
                 .truncation_mode = rd_str(&r, "data", "truncation_mode"),
                 .packing_strategy = rd_str(&r, "data", "packing_strategy"),
                 .completion_only_loss = !only || !strcmp(only, "auto") ? -1 : !strcmp(only, "true"),
                 .eval_packing =
                     ctrl_config_has(cfg, "data", "eval_packing") ? rd_bool(&r, "data", "eval_packing") : -1,
                 .eval_fraction = rd_float(&r, "data", "eval_fraction"),
                 .max_length = (int)rd_int(&r, "data", "max_length"),
                 .max_prompt_length = (int)rd_int(&r, "data", "max_prompt_length"),
                 .max_completion_length = (int)rd_int(&r, "data", "max_completion_length"),
                 .pad_to_multiple_of = (int)rd_int(&r, "data", "pad_to_multiple_of"),
                 .packing = rd_bool(&r, "data", "packing"),
                 .padding_free = rd_bool(&r, "data", "padding_free"),
                 .assistant_only_loss = rd_bool(&r, "data", "assistant_only_loss"),
                 .shuffle = rd_bool(&r, "data", "shuffle"),
                 .skip_bad_rows = rd_bool(&r, "data", "skip_bad_rows")},
        .train = {.optimizer = rd_str(&r, "train", "optimizer"),
                  .dtype = rd_str(&r, "train", "dtype"),
                  .lr_scheduler_type = rd_str(&r, "train", "lr_scheduler_type"),
                  .save_strategy = rd_str(&r, "train", "save_strategy"),
                  .resume_from_checkpoint = ctrl_config_get_string(cfg, "train", "resume_from_checkpoint"),
                  .learning_rate = rd_float(&r, "train", "learning_rate"),
                  .min_lr_rate = rd_float(&r, "train", "min_lr_rate"),
                  .warmup_ratio = rd_float(&r, "train", "warmup_ratio"),
                  .num_train_epochs = rd_float(&r, "train", "num_train_epochs"),
                  .max_grad_norm = rd_float(&r, "train", "max_grad_norm"),
                  .weight_decay = rd_float(&r, "train", "weight_decay"),
                  .router_aux_loss_coef = ctrl_config_has(cfg, "train", "router_aux_loss_coef")
                                              ? rd_float(&r, "train", "router_aux_loss_coef")
                                              : -1,
                  .max_steps = (long)rd_int(&r, "train", "max_steps"),
                  .warmup_steps = (long)rd_int(&r, "train", "warmup_steps"),
                  .logging_steps = (long)rd_int(&r, "train", "logging_steps"),
                  .eval_steps = (long)rd_int(&r, "train", "eval_steps"),
                  .save_steps = (long)rd_int(&r, "train", "save_steps"),
                  .per_device_train_batch_size = (int)rd_int(&r, "train", "per_device_train_batch_size"),
                  .per_device_eval_batch_size = (int)rd_int(&r, "train", "per_device_eval_batch_size"),
                  .gradient_accumulation_steps = (int)rd_int(&r, "train", "gradient_accumulation_steps"),
                  .save_total_limit = (int)rd_int(&r, "train", "save_total_limit"),
                  .save_dtype = rd_str(&r, "train", "save_dtype"),
                  .report_png = list_has(report, "png") || list_has(report, "all"),
                  .report_tensorboard = list_has(report, "tensorboard") || list_has(report, "all"),
                  .ddp_timeout = (int)rd_int(&r, "train", "ddp_timeout"),
                  .ddp_shared_memory = rd_bool(&r, "train", "ddp_shared_memory"),
                  .bf16_fallback_fp32 = !bf16_fallback || !strcmp(bf16_fallback, "fp32")},
        .generation = {.server = mode && !strcmp(mode, "server"),
                       .server_url = rd_str(&r, "generation", "server_url"),
                       .temperature = rd_float(&r, "generation", "temperature"),
                       .top_p = rd_float(&r, "generation", "top_p"),
                       .min_p = rd_float(&r, "generation", "min_p"),
                       .repetition_penalty = rd_float(&r, "generation", "repetition_penalty"),
                       .top_k = (int)rd_int(&r, "generation", "top_k"),
                       .sleep = (int)rd_int(&r, "generation", "sleep"),
                       .log_completions = rd_bool(&r, "generation", "log_completions"),
                       .ds3_gather_for_generation = rd_bool(&r, "generation", "ds3_gather_for_generation"),
                       .kv_cache_bytes = (long)rd_int(&r, "generation", "kv_cache_bytes"),
                       .gpu_memory_utilization = rd_float(&r, "generation", "gpu_memory_utilization"),
                       .block_size = (int)rd_int(&r, "generation", "block_size"),
                       .max_num_seqs = (int)rd_int(&r, "generation", "max_num_seqs"),
                       .max_num_batched_tokens = (int)rd_int(&r, "generation", "max_num_batched_tokens"),
                       .kv_cache_dtype = !kv || !strcmp(kv, "auto") ? -1 : !strcmp(kv, "bf16"),
                       .decode_threads = (int)rd_int(&r, "generation", "decode_threads")},
        .peft = {.enabled = rd_bool(&r, "peft", "enabled"),
                 .r = (int)rd_int(&r, "peft", "r"),
                 .lora_alpha = rd_float(&r, "peft", "lora_alpha"),
                 .lora_dropout = rd_float(&r, "peft", "lora_dropout"),
                 .use_rslora = rd_bool(&r, "peft", "use_rslora"),
                 .use_dora = rd_bool(&r, "peft", "use_dora"),
                 .lora_bias = rd_bool(&r, "peft", "lora_bias"),
                 .ensure_weight_tying = rd_bool(&r, "peft", "ensure_weight_tying"),
                 .nf4 = !strcmp(rd_str(&r, "peft", "quantization"), "nf4"),
                 .embed_bf16 = !strcmp(rd_str(&r, "peft", "embedding_dtype"), "bf16")   ? 1
                               : !strcmp(rd_str(&r, "peft", "embedding_dtype"), "auto") ? 2
                                                                                        : 0,
                 .init_lora_weights = rd_str(&r, "peft", "init_lora_weights"),
                 .adapter_path = ctrl_config_get_string(cfg, "peft", "adapter_path")},
        .teacher = {.path = ctrl_config_get_string(cfg, "teacher", "path"),
                    .bf16 = tdtype && !strcmp(tdtype, "bf16")},
        .memory = {.reduce_bucket_size = rd_floats_or_auto(&r, "memory", "reduce_bucket_size", 1),
                   .prefetch_bucket_size = rd_floats_or_auto(&r, "memory", "prefetch_bucket_size", 0),
                   .overlap_comm = rd_bool(&r, "memory", "overlap_comm"),
                   .offload_dir = ctrl_config_get_string(cfg, "memory", "offload_dir"),
                   .offload_overlap = rd_bool(&r, "memory", "offload_overlap"),
                   .param_persistence_threshold =
                       rd_floats_or_auto(&r, "memory", "stage3_param_persistence_threshold", 0)}};
    /* the lists as the projections' bits (the option table allows only their names): the seven, then
     * Phi-3's fused qkv_proj and gate_up_proj (ctrl_lora_module_names' order) */
    static const char *const proj[] = {"q_proj",  "k_proj",    "v_proj",   "o_proj",      "gate_proj",
                                       "up_proj", "down_proj", "qkv_proj", "gate_up_proj"};
    char item[64];
    for (int i = 0; i < ctrl_config_list_count(cfg, "peft", "target_modules"); i++) {
        const char *t = ctrl_config_list_item(cfg, "peft", "target_modules", i, item, sizeof item);
        for (int k = 0; t && k < 9; k++) s->peft.target_bits |= !strcmp(t, proj[k]) ? 1u << k : 0;
        s->peft.all_linear |= t && !strcmp(t, "all-linear");
    }
    for (int i = 0; i < ctrl_config_list_count(cfg, "peft", "target_parameters"); i++) {
        const char *t = ctrl_config_list_item(cfg, "peft", "target_parameters", i, item, sizeof item);
        s->peft.param_bits |= t && !strcmp(t, "experts.gate_up_proj") ? 1u : t ? 2u : 0u;
    }
    for (int i = 0; i < ctrl_config_list_count(cfg, "peft", "modules_to_save"); i++) {
        const char *t = ctrl_config_list_item(cfg, "peft", "modules_to_save", i, item, sizeof item);
        s->peft.save_embed_tokens |= t && !strcmp(t, "embed_tokens");
        s->peft.save_lm_head |= t && !strcmp(t, "lm_head");
        s->peft.save_score |= t && (!strcmp(t, "score") || !strcmp(t, "classifier"));
    }
    if (r.st == CTRL_OK) r.st = settings_read_peft_choices(cfg, s);
    for (int i = 0; i < cfg->plugins.n_rewards; i++)
        cfg->plugins.reward[i].weight = rd_float(&r, cfg->plugins.reward[i].section, "weight");
    const char *shard = rd_str(&r, "train", "save_max_shard_size");
    if (r.st == CTRL_OK && ctrl_parse_shard_size(shard, &s->train.save_max_shard_bytes) != CTRL_OK) {
        const config_entry *e = config_find(cfg, "train", "save_max_shard_size");
        return ctrl_error_wrap(CTRL_ERR_CONFIG, "%s: [train] save_max_shard_size",
                               e ? e->where : cfg->file_name);
    }
    /* with LoRA the run saves the adapter alone (one adapter_model.safetensors, in the adapters'
     * dtype, as PEFT saves it): a model's dtype or shard size set for it would do nothing */
    static const char *const model_only[] = {"save_dtype", "save_max_shard_size"};
    for (int i = 0; r.st == CTRL_OK && s->peft.enabled && i < 2; i++) {
        const config_entry *e = config_find(cfg, "train", model_only[i]);
        if (e && strcmp(e->where, "default") != 0)
            return ctrl_error_set(CTRL_ERR_CONFIG,
                                  "%s: [train] %s = %s with [peft] enabled: the run saves the LoRA adapter "
                                  "(adapter_model.safetensors, as PEFT saves it), not a model; `ctrl model "
                                  "merge --dtype ... --max-shard-size ...` saves the merged model so",
                                  e->where, model_only[i], e->value);
    }
    return r.st;
}

const ctrl_run_plugins *ctrl_config_plugins(const ctrl_config *cfg) { return &cfg->plugins; }
const ctrl_run_settings *ctrl_config_settings(const ctrl_config *cfg) { return &cfg->settings; }
