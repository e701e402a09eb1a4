/* ctrl model info DIR | model init ... | model logprobs --model DIR --input FILE.jsonl */
#include <cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
#include "hub_cache.h"
#include "model/model.h"
#include "model/peft.h"
#include "train/checkpoint.h"
#include "tokenizer/tokenizer.h"

static const char *const arch_names[CTRL_ARCH_COUNT] = {"llama",  "qwen2", "qwen3",     "mistral", "gemma2",
                                                        "gemma3", "phi3",  "qwen3_moe", "mixtral", "olmoe"};
/* config.json's model_type of each (Gemma 3's text model is gemma3_text) */
static const char *const model_types[CTRL_ARCH_COUNT] = {
    "llama", "qwen2", "qwen3", "mistral", "gemma2", "gemma3_text", "phi3", "qwen3_moe", "mixtral", "olmoe"};

/* A model argument: a directory, or a Hub id found in the local Hugging Face cache (hub_cache.h);
 * one static buffer per call site is enough for these one-shot commands. */
static const char *cli_model_dir(const char *arg) {
    static char resolved[4][4096];
    static int next;
    char *buf = resolved[next++ % 4];
    return ctrl_hub_resolve(arg, buf, sizeof resolved[0]);
}

static int info(int argc, char **argv) {
    if (argc != 2) return cli_usage_error(&cli_cmd_model, "model info needs exactly one DIR");
    ctrl_model_config c;
    ctrl_status st = ctrl_model_config_load(cli_model_dir(argv[1]), &c);
    if (st != CTRL_OK) return cli_fail(st);
    /* Counted from the shapes, without loading the weights. */
    const long long total = (long long)ctrl_model_config_param_count(&c);
    printf("architecture      %s (%s)\n", arch_names[c.arch], c.model_type);
    printf("parameters        %lld (%.2fM)\n", total, total / 1e6);
    if (c.n_experts > 0) { /* the experts a token does not go to are not active for it */
        int sparse = 0;
        for (int l = 0; l < c.n_layers; l++) sparse += c.moe_layer[l];
        const long long idle = (long long)sparse * (c.n_experts - c.n_experts_per_tok) * 3LL *
                               c.moe_intermediate_size * c.hidden_size;
        printf("experts           %d in %d of %d layers, %d per token%s, width %d\n", c.n_experts, sparse,
               c.n_layers, c.n_experts_per_tok, c.norm_topk_prob ? " (weights renormalised)" : "",
               c.moe_intermediate_size);
        printf("active parameters %lld (%.2fM) per token\n", total - idle, (total - idle) / 1e6);
    }
    if (c.num_labels > 0)
        printf("head              score, %d label%s (sequence classifier; pad_token_id %d)\n", c.num_labels,
               c.num_labels > 1 ? "s" : "", c.pad_token_id);
    printf("layers            %d\n", c.n_layers);
    printf("hidden / mlp      %d / %d\n", c.hidden_size, c.intermediate_size);
    printf("heads / kv heads  %d / %d (head_dim %d)\n", c.n_heads, c.n_kv_heads, c.head_dim);
    printf("vocabulary        %d%s\n", c.vocab_size, c.tie_word_embeddings ? " (tied embeddings)" : "");
    printf("context           %d (rope theta %g%s)\n", c.max_position_embeddings, c.rope.theta,
           c.rope.kind ? ", scaled" : "");
    if (c.sliding_window && c.has_layer_types) {
        int n = 0;
        for (int l = 0; l < c.n_layers; l++) n += c.sliding_layer[l];
        printf("sliding window    %d (%d of %d layers; the others full)\n", c.sliding_window, n, c.n_layers);
    } else if (c.sliding_window) {
        printf("sliding window    %d\n", c.sliding_window);
    }
    if (c.sandwich_norm)
        printf("gemma             (1 + w) norms, sandwich norms, GeGLU, embeddings x %g, query scale %g\n",
               (double)c.embed_scale, (double)c.attn_scale);
    if (c.attn_softcap > 0 || c.final_softcap > 0)
        printf("soft-capping      attention %g, final logits %g (0: none)\n", (double)c.attn_softcap,
               (double)c.final_softcap);
    char path[4200];
    snprintf(path, sizeof path, "%s/model.safetensors", argv[1]);
    struct stat sb;
    if (stat(path, &sb) == 0)
        printf("weights           model.safetensors (%.1f MiB)\n", sb.st_size / 1048576.0);
    return 0;
}

static int init(ctrl_cli *cli, int argc, char **argv) {
    (void)cli;
    ctrl_model_config c;
    memset(&c, 0, sizeof c);
    const char *arch = NULL, *tok_dir = NULL, *out = NULL;
    int tie = -1, head_dim = 0, experts = 0, per_tok = 0, moe_width = 0;
    long seed = 42;
    c.intermediate_size = 0, c.vocab_size = 0, c.n_kv_heads = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--tie-embeddings")) {
            tie = 1;
            continue;
        }
        if (!v) return cli_usage_error(&cli_cmd_model, "%s needs a value", a);
        i++;
        if (!strcmp(a, "--arch"))
            arch = v;
        else if (!strcmp(a, "--hidden"))
            c.hidden_size = atoi(v);
        else if (!strcmp(a, "--layers"))
            c.n_layers = atoi(v);
        else if (!strcmp(a, "--heads"))
            c.n_heads = atoi(v);
        else if (!strcmp(a, "--kv-heads"))
            c.n_kv_heads = atoi(v);
        else if (!strcmp(a, "--head-dim"))
            head_dim = atoi(v);
        else if (!strcmp(a, "--experts"))
            experts = atoi(v);
        else if (!strcmp(a, "--experts-per-tok"))
            per_tok = atoi(v);
        else if (!strcmp(a, "--moe-intermediate"))
            moe_width = atoi(v);
        else if (!strcmp(a, "--intermediate"))
            c.intermediate_size = atoi(v);
        else if (!strcmp(a, "--vocab"))
            c.vocab_size = atoi(v);
        else if (!strcmp(a, "--tokenizer"))
            tok_dir = v;
        else if (!strcmp(a, "--out"))
            out = v;
        else if (!strcmp(a, "--seed"))
            seed = atol(v);
        else
            return cli_usage_error(&cli_cmd_model, "model init: unknown option '%s'", a);
    }
    int k = -1;
    for (int i = 0; arch && i < CTRL_ARCH_COUNT; i++)
        if (!strcmp(arch, arch_names[i])) k = i;
    if (k < 0)
        return cli_usage_error(&cli_cmd_model, "model init: --arch must be llama, qwen2, qwen3, mistral, "
                                               "gemma2, gemma3, phi3, qwen3_moe, mixtral or olmoe");
    if (!out || !tok_dir || c.hidden_size <= 0 || c.n_layers <= 0 || c.n_heads <= 0)
        return cli_usage_error(&cli_cmd_model,
                               "model init needs --arch, --hidden, --layers, --heads, --tokenizer, --out");
    ctrl_tokenizer *tok;
    ctrl_status st = ctrl_tokenizer_load(tok_dir, &tok);
    if (st != CTRL_OK) return cli_fail(st);
    c.arch = (ctrl_arch)k;
    snprintf(c.model_type, sizeof c.model_type, "%s", model_types[k]);
    if (!c.n_kv_heads) c.n_kv_heads = c.n_heads;
    if (c.n_heads % c.n_kv_heads || (!head_dim && c.hidden_size % c.n_heads))
        return cli_usage_error(&cli_cmd_model,
                               "model init: --heads must be a multiple of --kv-heads and divide "
                               "--hidden (unless --head-dim is given)");
    if (head_dim < 0 || head_dim % 2 || head_dim > CTRL_MODEL_MAX_HEAD_DIM ||
        c.n_layers > CTRL_MODEL_MAX_LAYERS)
        return cli_usage_error(&cli_cmd_model,
                               "model init: --head-dim must be even and at most %d, --layers at most %d",
                               CTRL_MODEL_MAX_HEAD_DIM, CTRL_MODEL_MAX_LAYERS);
    c.head_dim = head_dim ? head_dim : c.hidden_size / c.n_heads;
    if (!c.intermediate_size) c.intermediate_size = 4 * c.hidden_size;
    if (!c.vocab_size) c.vocab_size = ctrl_tokenizer_vocab_size(tok);
    if (c.vocab_size < ctrl_tokenizer_vocab_size(tok))
        return cli_usage_error(&cli_cmd_model, "model init: --vocab %d is smaller than the tokenizer's %d",
                               c.vocab_size, ctrl_tokenizer_vocab_size(tok));
    c.max_position_embeddings = 4096;
    c.rms_norm_eps = 1e-6f;
    const int gemma = c.arch == CTRL_ARCH_GEMMA2 || c.arch == CTRL_ARCH_GEMMA3;
    c.tie_word_embeddings = tie >= 0 ? tie : gemma; /* transformers' defaults */
    c.qkv_bias = c.arch == CTRL_ARCH_QWEN2;
    c.qk_norm = c.arch == CTRL_ARCH_QWEN3 || c.arch == CTRL_ARCH_QWEN3_MOE;
    c.rope.kind = CTRL_ROPE_DEFAULT, c.rope.theta = 1000000.0, c.rope.factor = 1,
    c.rope.partial_rotary_factor = 1;
    c.bos_token_id = ctrl_tokenizer_bos_id(tok);
    c.eos_token_id = ctrl_tokenizer_eos_id(tok);
    c.pad_token_id = -1;
    ctrl_model_config_family_defaults(
        &c); /* Gemma's fields at Gemma2Config's / Gemma3TextConfig's defaults */
    if (c.arch == CTRL_ARCH_GEMMA2 || c.arch == CTRL_ARCH_PHI3) c.rope.theta = 10000.0;
    if (c.arch == CTRL_ARCH_PHI3) c.rms_norm_eps = 1e-5f;
    const int moe = c.arch == CTRL_ARCH_QWEN3_MOE || c.arch == CTRL_ARCH_MIXTRAL || c.arch == CTRL_ARCH_OLMOE;
    if (moe != (experts > 0) || experts > CTRL_MODEL_MAX_EXPERTS ||
        (experts > 0 && (per_tok < 1 || per_tok > experts)) || moe_width < 0)
        return cli_usage_error(
            &cli_cmd_model,
            "model init: qwen3_moe, mixtral and olmoe (and only they) take --experts N (at most %d) "
            "and --experts-per-tok K (1..N)",
            CTRL_MODEL_MAX_EXPERTS);
    if (experts > 0) { /* Qwen3MoeConfig's defaults otherwise: every layer sparse, no renormalisation */
        c.n_experts = experts, c.n_experts_per_tok = per_tok;
        c.moe_intermediate_size = moe_width ? moe_width : c.intermediate_size / 4;
        if (c.arch == CTRL_ARCH_MIXTRAL) /* MixtralConfig: experts of intermediate_size, renormalised */
            c.moe_intermediate_size = c.intermediate_size, c.norm_topk_prob = 1, c.rms_norm_eps = 1e-5f;
        if (c.arch ==
            CTRL_ARCH_OLMOE) /* OlmoeConfig: experts of intermediate_size, whole-projection q/k norms */
            c.moe_intermediate_size = c.intermediate_size, c.rms_norm_eps = 1e-5f;
        c.router_aux_loss_coef = c.arch == CTRL_ARCH_OLMOE ? 0.01f : 0.001f;
        c.qk_norm = c.arch == CTRL_ARCH_QWEN3_MOE ? 1 : c.arch == CTRL_ARCH_OLMOE ? 2 : 0;
        memset(c.moe_layer, 1, (size_t)c.n_layers);
    }
    if (gemma) c.pad_token_id = ctrl_tokenizer_pad_id(tok);
    ctrl_tokenizer_free(tok);
    ctrl_model *m;
    if ((st = ctrl_model_create(&c, NULL, &m)) != CTRL_OK) return cli_fail(st);
    ctrl_model_init_random(m, (uint64_t)seed, 0.02f);
    st = ctrl_model_save(m, out, CTRL_F32);
    for (int i = 0; st == CTRL_OK && i < 2; i++) {
        static const char *const files[] = {"tokenizer.json", "tokenizer_config.json"};
        char from[4200], to[4200];
        snprintf(from, sizeof from, "%s/%s", tok_dir, files[i]);
        snprintf(to, sizeof to, "%s/%s", out, files[i]);
        struct stat sb;
        if (stat(from, &sb) == 0) st = ctrl_copy_file(from, to, NULL);
    }
    size_t n;
    ctrl_model_params(m, &n);
    ctrl_model_free(m);
    if (st != CTRL_OK) return cli_fail(st);
    printf("%s: %s model with %.2fM parameters (seed %ld)\n", out, arch_names[k], n / 1e6, seed);
    return 0;
}

/* One JSON line -> token ids: {"input_ids": [...]} as given, {"text": ...} through the tokenizer. */
static ctrl_status line_ids(const cJSON *o, const ctrl_tokenizer *tok, const char *where, int32_t **ids,
                            size_t *n) {
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(o, "input_ids");
    const cJSON *text = cJSON_GetObjectItemCaseSensitive(o, "text");
    if (cJSON_IsArray(arr)) {
        *n = (size_t)cJSON_GetArraySize(arr);
        *ids = malloc(sizeof(int32_t) * (*n ? *n : 1));
        if (!*ids) return ctrl_error_set(CTRL_ERR_NOMEM, "%s: out of memory for %zu ids", where, *n);
        size_t i = 0;
        for (const cJSON *e = arr->child; e; e = e->next) {
            if (!cJSON_IsNumber(e)) {
                free(*ids);
                return ctrl_error_set(CTRL_ERR_FORMAT, "%s: input_ids must be numbers", where);
            }
            (*ids)[i++] = (int32_t)e->valuedouble;
        }
        return CTRL_OK;
    }
    if (cJSON_IsString(text)) {
        if (!tok)
            return ctrl_error_set(CTRL_ERR_FORMAT, "%s: \"text\" needs a tokenizer in the model directory",
                                  where);
        return ctrl_tokenizer_encode(tok, text->valuestring, strlen(text->valuestring), 1, ids, n);
    }
    return ctrl_error_set(CTRL_ERR_FORMAT, "%s: expected {\"text\": ...} or {\"input_ids\": [...]}", where);
}

static int logprobs(ctrl_cli *cli, int argc, char **argv) {
    const char *model_dir = NULL, *input = NULL, *attention = "flash", *adapter = NULL;
    for (int i = 1; i < argc; i++) {
        if (i + 1 >= argc) return cli_usage_error(&cli_cmd_model, "%s needs a value", argv[i]);
        if (!strcmp(argv[i], "--model"))
            model_dir = cli_model_dir(argv[++i]);
        else if (!strcmp(argv[i], "--adapter"))
            adapter = argv[++i];
        else if (!strcmp(argv[i], "--input"))
            input = argv[++i];
        else if (!strcmp(argv[i], "--attention"))
            attention = argv[++i];
        else
            return cli_usage_error(&cli_cmd_model, "model logprobs: unknown option '%s'", argv[i]);
    }
    if (!model_dir || !input)
        return cli_usage_error(&cli_cmd_model, "model logprobs needs --model DIR and --input FILE");
    ctrl_registry *reg;
    ctrl_status st = cli_plugins(cli, &reg);
    if (st != CTRL_OK) return cli_fail(st);
    const ctrl_plugin_entry *e = ctrl_registry_find(reg, CTRL_KIND_ATTENTION, attention);
    if (!e) {
        char names[512];
        ctrl_registry_names(reg, CTRL_KIND_ATTENTION, names, sizeof names);
        ctrl_error_set(CTRL_ERR_USAGE, "--attention %s: no such attention plugin (loaded: %s)", attention,
                       names);
        return cli_fail(CTRL_ERR_USAGE);
    }
    ctrl_model *m;
    st = adapter ? ctrl_peft_load(model_dir, adapter, e->plugin->ops, &m)
                 : ctrl_model_load(model_dir, e->plugin->ops, &m);
    if (st != CTRL_OK) return cli_fail(st);
    ctrl_tokenizer *tok = NULL;
    char tok_path[4200];
    snprintf(tok_path, sizeof tok_path, "%s/tokenizer.json", model_dir);
    struct stat sb;
    if (stat(tok_path, &sb) == 0 && (st = ctrl_tokenizer_load(model_dir, &tok)) != CTRL_OK) {
        ctrl_model_free(m);
        return cli_fail(st);
    }
    FILE *f = fopen(input, "r");
    if (!f) {
        ctrl_error_set(CTRL_ERR_IO, "%s: %s", input, strerror(errno));
        ctrl_tokenizer_free(tok), ctrl_model_free(m);
        return cli_fail(CTRL_ERR_IO);
    }
    size_t cap = 1 << 16;
    char *line = malloc(cap);
    if (!line) st = ctrl_error_set(CTRL_ERR_NOMEM, "%s: out of memory for a line", input);
    int lineno = 0;
    while (st == CTRL_OK && fgets(line, (int)cap, f)) {
        lineno++;
        if (line[strspn(line, " \t\r\n")] == '\0') continue;
        char where[4200];
        snprintf(where, sizeof where, "%s:%d", input, lineno);
        cJSON *o = cJSON_Parse(line);
        if (!cJSON_IsObject(o)) {
            cJSON_Delete(o);
            st = ctrl_error_set(CTRL_ERR_FORMAT, "%s: not a JSON object (or longer than %zu bytes)", where,
                                cap - 1);
            break;
        }
        int32_t *ids = NULL;
        size_t n = 0;
        st = line_ids(o, tok, where, &ids, &n);
        cJSON_Delete(o);
        if (st != CTRL_OK) break;
        if (n < 2) {
            free(ids);
            st = ctrl_error_set(CTRL_ERR_FORMAT, "%s: needs at least 2 tokens", where);
            break;
        }
        int32_t *pos = malloc(sizeof(int32_t) * n), *tg = malloc(sizeof(int32_t) * n),
                cu[2] = {0, (int32_t)n};
        float *lp = malloc(sizeof(float) * n);
        if (!pos || !tg || !lp) {
            free(ids), free(pos), free(tg), free(lp);
            st = ctrl_error_set(CTRL_ERR_NOMEM, "%s: out of memory for %zu tokens", where, n);
            break;
        }
        for (size_t i = 0; i < n; i++) pos[i] = (int32_t)i, tg[i] = i + 1 < n ? ids[i + 1] : -100;
        ctrl_batch b = {
            .T = (int)n, .B = 1, .tokens = ids, .positions = pos, .cu_seqlens = cu, .targets = tg};
        st = ctrl_model_forward(m, &b, lp, NULL, NULL);
        if (st == CTRL_OK) {
            /* logprobs[i] is log p(token i | tokens before it); token 0 has none. */
            cJSON *out = cJSON_CreateObject(), *ia = cJSON_AddArrayToObject(out, "input_ids");
            cJSON *la = cJSON_AddArrayToObject(out, "logprobs");
            double sum = 0;
            for (size_t i = 0; i < n; i++) {
                cJSON_AddItemToArray(ia, cJSON_CreateNumber(ids[i]));
                cJSON_AddItemToArray(la, i == 0 ? cJSON_CreateNull() : cJSON_CreateNumber(lp[i - 1]));
                if (i) sum += lp[i - 1];
            }
            cJSON_AddNumberToObject(out, "loss", -sum / (double)(n - 1));
            char *text = cJSON_PrintUnformatted(out);
            puts(text);
            cJSON_free(text);
            cJSON_Delete(out);
        }
        free(ids), free(pos), free(tg), free(lp);
    }
    free(line);
    fclose(f);
    ctrl_tokenizer_free(tok);
    ctrl_model_free(m);
    return st == CTRL_OK ? 0 : cli_fail(st);
}

/* --dtype and --max-shard-size of merge and convert: auto is `source`'s dtype. 0 when the option was
 * one of them (*i advanced past its value), 1 when it is not, -1 on a bad value (reported). */
static int save_option(int argc, char **argv, int *i, const char *cmd, const char **dtype, int64_t *shard) {
    if (strcmp(argv[*i], "--dtype") != 0 && strcmp(argv[*i], "--max-shard-size") != 0) return 1;
    if (*i + 1 >= argc) return cli_usage_error(&cli_cmd_model, "%s needs a value", argv[*i]), -1;
    const char *v = argv[++*i];
    if (!strcmp(argv[*i - 1], "--dtype")) {
        if (strcmp(v, "auto") && strcmp(v, "fp32") && strcmp(v, "bf16") && strcmp(v, "fp16"))
            return cli_usage_error(&cli_cmd_model, "model %s: --dtype %s: expected auto, fp32, bf16 or fp16",
                                   cmd, v),
                   -1;
        *dtype = v;
        return 0;
    }
    if (ctrl_parse_shard_size(v, shard) != CTRL_OK)
        return cli_usage_error(&cli_cmd_model, "model %s: --max-shard-size %s", cmd, ctrl_error_message()),
               -1;
    return 0;
}

/* Saves m into out as --dtype (auto: source's) and --max-shard-size say, with source's tokenizer files. */
static ctrl_status save_with(ctrl_model *m, const char *out, const char *source, const char *dtype_name,
                             int64_t shard) {
    ctrl_dtype dtype = !strcmp(dtype_name, "bf16")   ? CTRL_BF16
                       : !strcmp(dtype_name, "fp16") ? CTRL_F16
                                                     : CTRL_F32;
    ctrl_status st = !strcmp(dtype_name, "auto") ? ctrl_model_dir_dtype(source, &dtype) : CTRL_OK;
    if (st == CTRL_OK) st = ctrl_model_save_sharded(m, out, dtype, shard);
    if (st == CTRL_OK) st = ctrl_copy_tokenizer_files(source, out);
    return st;
}

/* --base DIR --adapter DIR --out DIR (all three needed) and, where dtype is given, the SAVE options
 * (merge's): 0, or the usage error's exit code. */
static int base_adapter_out(int argc, char **argv, const char *cmd, const char **base, const char **adapter,
                            const char **out, const char **dtype, int64_t *shard) {
    for (int i = 1; i < argc; i++) {
        const int o = dtype ? save_option(argc, argv, &i, cmd, dtype, shard) : 1;
        if (o < 0) return 2;
        if (o == 0) continue;
        if (i + 1 >= argc) return cli_usage_error(&cli_cmd_model, "%s needs a value", argv[i]);
        if (!strcmp(argv[i], "--base"))
            *base = cli_model_dir(argv[++i]);
        else if (!strcmp(argv[i], "--adapter"))
            *adapter = argv[++i];
        else if (!strcmp(argv[i], "--out"))
            *out = argv[++i];
        else
            return cli_usage_error(&cli_cmd_model, "model %s: unknown option '%s'", cmd, argv[i]);
    }
    if (!*base || !*adapter || !*out)
        return cli_usage_error(&cli_cmd_model, "model %s needs --base DIR --adapter DIR --out DIR", cmd);
    return 0;
}

/* ctrl model merge --base DIR --adapter DIR --out DIR: PEFT's merge_and_unload, saved as a plain HF
 * model directory (with the base's tokenizer files), in the base's dtype unless --dtype says. */
static int merge(int argc, char **argv) {
    const char *base = NULL, *adapter = NULL, *out = NULL, *dtype = "auto";
    int64_t shard = CTRL_DEFAULT_MAX_SHARD;
    const int bad = base_adapter_out(argc, argv, "merge", &base, &adapter, &out, &dtype, &shard);
    if (bad) return bad;
    ctrl_model *m;
    ctrl_status st = ctrl_peft_load(base, adapter, NULL, &m);
    if (st != CTRL_OK) return cli_fail(st);
    st = ctrl_peft_merge(m);
    if (st == CTRL_OK) st = save_with(m, out, base, dtype, shard);
    ctrl_model_free(m);
    if (st != CTRL_OK) return cli_fail(st);
    printf("%s: %s merged into %s\n", out, adapter, base);
    return 0;
}

/* ctrl model convert --model DIR --out DIR [--dtype ...] [--max-shard-size ...]: DIR saved again as
 * ctrl saves a trained model (config.json carried over, the dtype and shards asked for). */
static int convert(int argc, char **argv) {
    const char *model = NULL, *out = NULL, *dtype = "auto";
    int64_t shard = CTRL_DEFAULT_MAX_SHARD;
    for (int i = 1; i < argc; i++) {
        const int o = save_option(argc, argv, &i, "convert", &dtype, &shard);
        if (o < 0) return 2;
        if (o == 0) continue;
        if (i + 1 >= argc) return cli_usage_error(&cli_cmd_model, "%s needs a value", argv[i]);
        if (!strcmp(argv[i], "--model"))
            model = cli_model_dir(argv[++i]);
        else if (!strcmp(argv[i], "--out"))
            out = argv[++i];
        else
            return cli_usage_error(&cli_cmd_model, "model convert: unknown option '%s'", argv[i]);
    }
    if (!model || !out) return cli_usage_error(&cli_cmd_model, "model convert needs --model DIR --out DIR");
    ctrl_model *m;
    ctrl_status st = ctrl_model_load(model, NULL, &m);
    if (st != CTRL_OK) return cli_fail(st);
    st = save_with(m, out, model, dtype, shard);
    ctrl_model_free(m);
    if (st != CTRL_OK) return cli_fail(st);
    printf("%s: %s saved\n", out, model);
    return 0;
}

/* ctrl model convert-adapter --base DIR --adapter DIR --out DIR: a PiSSA / OLoRA adapter as a plain LoRA
 * adapter of twice the rank over the original base (ctrl_peft_convert_to_lora). */
static int convert_adapter(int argc, char **argv) {
    const char *base = NULL, *adapter = NULL, *out = NULL;
    const int bad = base_adapter_out(argc, argv, "convert-adapter", &base, &adapter, &out, NULL, NULL);
    if (bad) return bad;
    const ctrl_status st = ctrl_peft_convert_to_lora(base, adapter, out);
    if (st != CTRL_OK) return cli_fail(st);
    printf("%s: %s as a plain LoRA adapter of %s\n", out, adapter, base);
    return 0;
}

static int run_model(ctrl_cli *cli, int argc, char **argv) {
    if (argc < 2)
        return cli_usage_error(&cli_cmd_model,
                               "expected info, init, logprobs, merge, convert or convert-adapter");
    if (!strcmp(argv[1], "info")) return info(argc - 1, argv + 1);
    if (!strcmp(argv[1], "init")) return init(cli, argc - 1, argv + 1);
    if (!strcmp(argv[1], "logprobs")) return logprobs(cli, argc - 1, argv + 1);
    if (!strcmp(argv[1], "merge")) return merge(argc - 1, argv + 1);
    if (!strcmp(argv[1], "convert")) return convert(argc - 1, argv + 1);
    if (!strcmp(argv[1], "convert-adapter")) return convert_adapter(argc - 1, argv + 1);
    return cli_usage_error(&cli_cmd_model,
                           "unknown subcommand '%s' (info, init, logprobs, merge, convert, convert-adapter)",
                           argv[1]);
}

const ctrl_command cli_cmd_model = {
    .name = "model",
    .summary =
        "inspect, create, score with, convert, or merge a LoRA adapter into a Hugging Face model directory",
    .usage =
        "usage: ctrl model info DIR\n"
        "       ctrl model init --arch llama|qwen2|qwen3|mistral|gemma2|gemma3|phi3|qwen3_moe|mixtral|olmoe\n"
        "                       --hidden N --layers N --heads N [--kv-heads N] [--head-dim N]\n"
        "                       [--intermediate N] [--vocab N] [--tie-embeddings] [--seed S]\n"
        "                       [--experts N --experts-per-tok K [--moe-intermediate N]]\n"
        "                       --tokenizer DIR --out DIR\n"
        "       ctrl model logprobs --model DIR [--adapter DIR] --input FILE.jsonl [--attention NAME]\n"
        "       ctrl model merge --base DIR --adapter DIR --out DIR [SAVE]\n"
        "       ctrl model convert --model DIR --out DIR [SAVE]\n"
        "       ctrl model convert-adapter --base DIR --adapter DIR --out DIR\n"
        "       SAVE: [--dtype auto|fp32|bf16|fp16] [--max-shard-size SIZE]\n\n"
        "info: architecture, parameter count, shapes, vocabulary, context.\n"
        "init: a randomly initialised model (N(0, 0.02) weights, as transformers) saved as an HF\n"
        "      directory with the tokenizer's files; gemma2 takes Gemma2Config's defaults (tied\n"
        "      embeddings, soft-capping 50/30, window 4096 on alternating layers, query scalar 256),\n"
        "      gemma3 Gemma3TextConfig's (q/k norms, five sliding layers in six, RoPE 1e6 / 1e4),\n"
        "      phi3 Phi3Config's (fused qkv_proj / gate_up_proj, rms_norm_eps 1e-5), qwen3_moe\n"
        "      Qwen3MoeConfig's (every layer sparse, no top-k renormalisation; expert width\n"
        "      --intermediate / 4 unless --moe-intermediate says), mixtral MixtralConfig's (experts of\n"
        "      --intermediate, top-k renormalised).\n"
        "      info also reports experts and the parameters active per token.\n"
        "logprobs: each input line {\"text\": ...} or {\"input_ids\": [...]} gives one output line\n"
        "      {\"input_ids\", \"logprobs\" (null for the first token), \"loss\"} on stdout; with\n"
        "      --adapter, of the model under a PEFT LoRA adapter directory.\n"
        "merge: the adapter folded into the base weights (W += s B A, PEFT's merge_and_unload),\n"
        "      saved as a plain HF model directory with the base's tokenizer files.\n"
        "convert: the model saved again as ctrl saves a trained one.\n"
        "convert-adapter: a PiSSA / OLoRA adapter (init_lora_weights pissa, olora: over the base's\n"
        "      residual) as a plain LoRA adapter of twice the rank over the original base (PEFT's\n"
        "      path_initial_model_for_weight_conversion): for ctrl serve --lora and PEFT users alike.\n"
        "SAVE: as save_pretrained: config.json carried over (dtype updated), --dtype auto keeps the\n"
        "      source's, weights above --max-shard-size (default 50GB; 5GB, 500MB, 200KB or bytes)\n"
        "      in model-0000K-of-0000N.safetensors shards with model.safetensors.index.json.\n",
    .run = run_model,
};
