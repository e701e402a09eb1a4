/* Saving as transformers' save_pretrained saves, against directories save_pretrained itself wrote
 * (tests/reference/make_save_fixtures.py: tests/fixtures/save/): each loaded by ctrl (sharded,
 * f32 and bf16, tied embeddings and biases) and saved again with the same max_shard_size gives the
 * same files byte for byte -- model.safetensors.index.json, every shard (layout, header, data),
 * config.json (carried over: keys ctrl does not read, an eos_token_id list, number spellings) and
 * generation_config.json. The fixtures are models from_pretrained loaded, as a trainer holds them
 * (their state_dict sorted by name; a Qwen3-MoE's experts kept together as transformers 5 keeps
 * their fused storage). Nothing differs; what may legitimately: config keys a model changed (dtype,
 * the class and labels of a classifier, checked below), and the shards of a model built in Python
 * and never loaded (transformers keeps its modules' order there; ctrl always saves a loaded model). Also:
 * f32 -> bf16 / f16 rounding as torch's .to(), the log-probs of the sharded weights against
 * transformers', stale weight files of an earlier save removed, max_shard_size parsing and the
 * [train] keys, chat_template.jinja read ahead of tokenizer_config.json's template, and the
 * tokenizer files copied. */
#include <cJSON.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "file_text.h"
#include "json_file.h"
#include "model/model.h"
#include "model/model_config.h"
#include "model/safetensors.h"
#include "test.h"
#include "test_registry.h"
#include "tokenizer/tokenizer.h"
#include "train/checkpoint.h"

const ctrl_plugin *const *ctrl_plugins_eager(void);

static char *read_all(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    *len = buf ? fread(buf, 1, (size_t)n, f) : 0;
    if (buf) buf[*len] = '\0';
    fclose(f);
    return buf;
}

static int same_file(const char *a, const char *b) {
    size_t la = 0, lb = 0;
    char *x = read_all(a, &la), *y = read_all(b, &lb);
    const int same = x && y && la == lb && memcmp(x, y, la) == 0;
    free(x), free(y);
    return same;
}

static int count_files(const char *dir) {
    DIR *d = opendir(dir);
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));) n += e->d_name[0] != '.';
    if (d) closedir(d);
    return n;
}

static int exists(const char *dir, const char *name) {
    char p[2048];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    struct stat sb;
    return stat(p, &sb) == 0;
}

/* Every file of `want` is in `got` with the same bytes, and `got` has no other. */
static void check_same_dir(const char *got, const char *want) {
    DIR *d = opendir(want);
    CHECK(d != NULL);
    for (struct dirent *e; d && (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        char a[2048], b[2048];
        snprintf(a, sizeof a, "%s/%s", got, e->d_name);
        snprintf(b, sizeof b, "%s/%s", want, e->d_name);
        CHECK_MSG(same_file(a, b), "%s differs from transformers' %s", a, b);
    }
    if (d) closedir(d);
    CHECK_EQ_INT(count_files(got), count_files(want));
}

static void rm_rf(const char *dir) {
    char cmd[2100];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0);
}

static ctrl_model *load_fixture(const char *name) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/save/%s", CTRL_FIXTURE_DIR, name);
    ctrl_model *m = NULL;
    CHECK_MSG(ctrl_model_load(dir, NULL, &m) == CTRL_OK, "%s: %s", dir, ctrl_error_message());
    return m;
}

TEST(same_files_as_save_pretrained) {
    static const struct {
        const char *name;
        int64_t shard;
        ctrl_dtype dtype;
    } cases[] = {
        {"llama_fp32", 5000, CTRL_F32}, {"llama_bf16", 5000, CTRL_BF16}, {"qwen2_tied", 3000, CTRL_BF16}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char src[1024], out[] = "/tmp/ctrl-save-XXXXXX";
        snprintf(src, sizeof src, "%s/save/%s", CTRL_FIXTURE_DIR, cases[i].name);
        CHECK(mkdtemp(out) != NULL);
        ctrl_dtype dtype = CTRL_I32;
        CHECK_EQ_INT(ctrl_model_dir_dtype(src, &dtype), CTRL_OK);
        CHECK_MSG(dtype == cases[i].dtype, "%s: dtype %s", cases[i].name, ctrl_dtype_name(dtype));
        ctrl_model *m = load_fixture(cases[i].name);
        if (m)
            CHECK_MSG(ctrl_model_save_sharded(m, out, dtype, cases[i].shard) == CTRL_OK, "%s",
                      ctrl_error_message());
        check_same_dir(out, src);
        ctrl_model_free(m);
        rm_rf(out);
    }
}

/* f32 weights saved as bf16 round as torch's .to(torch.bfloat16): the bf16 fixture's files. */
TEST(fp32_saved_as_bf16_is_torchs_bf16) {
    char want[1024], out[] = "/tmp/ctrl-save-XXXXXX";
    snprintf(want, sizeof want, "%s/save/llama_bf16", CTRL_FIXTURE_DIR);
    CHECK(mkdtemp(out) != NULL);
    ctrl_model *m = load_fixture("llama_fp32");
    if (m) CHECK_EQ_INT(ctrl_model_save_sharded(m, out, CTRL_BF16, 5000), CTRL_OK);
    check_same_dir(out, want); /* config.json too: only "dtype" differs between the two sources */
    ctrl_model_free(m);
    rm_rf(out);
}

/* f16: torch's x.half() of values around every rounding case (f16.safetensors: x and h). */
TEST(fp16_rounds_as_torch) {
    char path[1024], tmp[] = "/tmp/ctrl-f16-XXXXXX", out[1100];
    snprintf(path, sizeof path, "%s/save/f16.safetensors", CTRL_FIXTURE_DIR);
    ctrl_safetensors *st = NULL, *back = NULL;
    CHECK_MSG(ctrl_safetensors_open(path, &st) == CTRL_OK, "%s", ctrl_error_message());
    if (!st) return;
    const ctrl_st_tensor *x = ctrl_safetensors_find(st, "x"), *h = ctrl_safetensors_find(st, "h");
    CHECK(x && h && h->dtype == CTRL_F16 && x->shape[0] == h->shape[0]);
    if (!x || !h) return;
    const int64_t n = x->shape[0];
    float *v = malloc(sizeof(float) * (size_t)n);
    CHECK_EQ_INT(ctrl_safetensors_read_f32(st, "x", v, n), CTRL_OK);
    CHECK(mkdtemp(tmp) != NULL);
    snprintf(out, sizeof out, "%s/h.safetensors", tmp);
    const ctrl_st_write w = {.name = "h", .data = v, .ndim = 1, .shape = {n}};
    CHECK_EQ_INT(ctrl_safetensors_write(out, &w, 1, CTRL_F16), CTRL_OK);
    CHECK_EQ_INT(ctrl_safetensors_open(out, &back), CTRL_OK);
    const ctrl_st_tensor *g = back ? ctrl_safetensors_find(back, "h") : NULL;
    CHECK(g && g->nbytes == h->nbytes);
    size_t la = 0, lb = 0;
    char *a = read_all(path, &la), *b = read_all(out, &lb);
    int mismatches = 0;
    for (int64_t i = 0; g && a && b && i < n; i++) {
        uint16_t want, got;
        memcpy(&want, a + h->offset + 2 * i, 2);
        memcpy(&got, b + g->offset + 2 * i, 2);
        if (want != got && mismatches++ < 5)
            printf("  x = %.9g: torch 0x%04x, ctrl 0x%04x\n", (double)v[i], want, got);
    }
    CHECK_EQ_INT(mismatches, 0);
    free(a), free(b), free(v);
    ctrl_safetensors_close(st), ctrl_safetensors_close(back);
    unlink(out);
    rmdir(tmp);
}

/* ctrl on the sharded directories: transformers' log-probs (make_save_fixtures.py). */
TEST(sharded_weights_give_transformers_logp) {
    char path[1024];
    snprintf(path, sizeof path, "%s/save/logp.json", CTRL_FIXTURE_DIR);
    cJSON *root = json_file(path);
    if (!root) return;
    const cJSON *tok = cJSON_GetObjectItemCaseSensitive(root, "tokens");
    const int T = cJSON_GetArraySize(tok);
    int32_t tokens[64], pos[64], targets[64], cu[2] = {0, T};
    for (int t = 0; t < T && t < 64; t++) {
        tokens[t] = (int32_t)cJSON_GetArrayItem(tok, t)->valuedouble, pos[t] = t;
        targets[t] = t + 1 < T ? (int32_t)cJSON_GetArrayItem(tok, t + 1)->valuedouble : -1;
    }
    const ctrl_plugin *eager = ctrl_plugins_eager()[0];
    if (eager->init) eager->init(ctrl_host_table());
    static const char *const names[] = {"llama_fp32", "llama_bf16", "qwen2_tied", "qwen3_moe"};
    for (int k = 0; k < 4; k++) {
        char dir[1024];
        snprintf(dir, sizeof dir, "%s/save/%s", CTRL_FIXTURE_DIR, names[k]);
        ctrl_model *m = NULL;
        CHECK_MSG(ctrl_model_load(dir, eager->ops, &m) == CTRL_OK, "%s: %s", dir, ctrl_error_message());
        if (!m) continue;
        float logp[64];
        ctrl_batch b = {
            .T = T, .B = 1, .tokens = tokens, .positions = pos, .cu_seqlens = cu, .targets = targets};
        CHECK_MSG(ctrl_model_forward(m, &b, logp, NULL, NULL) == CTRL_OK, "%s", ctrl_error_message());
        const cJSON *want = cJSON_GetObjectItemCaseSensitive(root, names[k]);
        double worst = 0;
        for (int t = 0; t + 1 < T; t++)
            worst = fmax(worst, fabs(logp[t] - cJSON_GetArrayItem(want, t)->valuedouble));
        CHECK_MSG(worst < 1e-4, "%s: log-probs up to %.3g from transformers'", names[k], worst);
        ctrl_model_free(m);
    }
    cJSON_Delete(root);
}

/* A save over an earlier one leaves only its own weight files: the loader never mixes two. */
TEST(earlier_weight_files_removed) {
    char out[] = "/tmp/ctrl-save-XXXXXX";
    CHECK(mkdtemp(out) != NULL);
    ctrl_model *m = load_fixture("llama_fp32");
    if (!m) return;
    CHECK_EQ_INT(ctrl_model_save_sharded(m, out, CTRL_F32, 5000), CTRL_OK);
    CHECK(exists(out, "model-00006-of-00006.safetensors") && exists(out, "model.safetensors.index.json"));
    CHECK_EQ_INT(ctrl_model_save(m, out, CTRL_F32), CTRL_OK); /* 50GB: one file */
    CHECK(exists(out, "model.safetensors") && !exists(out, "model.safetensors.index.json"));
    CHECK_EQ_INT(count_files(out), 3);
    CHECK_EQ_INT(ctrl_model_save_sharded(m, out, CTRL_BF16, 5000), CTRL_OK); /* 3 shards */
    CHECK(!exists(out, "model.safetensors") && exists(out, "model-00003-of-00003.safetensors"));
    CHECK_EQ_INT(count_files(out), 6);
    ctrl_model *back = NULL;
    CHECK_EQ_INT(ctrl_model_load(out, NULL, &back), CTRL_OK);
    ctrl_model_free(back), ctrl_model_free(m);
    rm_rf(out);
}

/* A causal LM saved with a score head: the class, labels and pad id change; every other key of the
 * source stays as it was; no generation_config.json (transformers writes none for a classifier). */
TEST(classifier_config_changes_only_what_changed) {
    char src[1024], path[1200], out[] = "/tmp/ctrl-save-XXXXXX";
    snprintf(src, sizeof src, "%s/save/llama_fp32", CTRL_FIXTURE_DIR);
    CHECK(mkdtemp(out) != NULL);
    ctrl_model_config cfg;
    CHECK_EQ_INT(ctrl_model_config_load(src, &cfg), CTRL_OK);
    cfg.num_labels = 1, cfg.pad_token_id = 0;
    ctrl_model *m = NULL;
    CHECK_MSG(ctrl_model_load_as(src, &cfg, NULL, "score.weight", &m) == CTRL_OK, "%s", ctrl_error_message());
    if (!m) return;
    CHECK_EQ_INT(ctrl_model_save(m, out, CTRL_F32), CTRL_OK);
    snprintf(path, sizeof path, "%s/config.json", src);
    cJSON *before = json_file(path);
    snprintf(path, sizeof path, "%s/config.json", out);
    cJSON *after = json_file(path);
    if (!before || !after) return;
    const char *arch =
        cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(after, "architectures"), 0)->valuestring;
    CHECK_STR(arch, "LlamaForSequenceClassification");
    CHECK_STR(cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(after, "id2label"), "0")
                  ->valuestring,
              "LABEL_0");
    CHECK(cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(after, "label2id"), "LABEL_0")
              ->valuedouble == 0);
    CHECK(cJSON_GetObjectItemCaseSensitive(after, "pad_token_id")->valuedouble == 0);
    int n_before = 0;
    for (const cJSON *e = before->child; e; e = e->next, n_before++) {
        if (!strcmp(e->string, "architectures") || !strcmp(e->string, "pad_token_id")) continue;
        CHECK_MSG(cJSON_Compare(e, cJSON_GetObjectItemCaseSensitive(after, e->string), 1), "%s changed",
                  e->string);
    }
    CHECK_EQ_INT(cJSON_GetArraySize(after), n_before + 2); /* id2label, label2id */
    CHECK(!exists(out, "generation_config.json"));
    ctrl_model *back = NULL; /* and ctrl reads it back as a classifier */
    CHECK_MSG(ctrl_model_load(out, NULL, &back) == CTRL_OK, "%s", ctrl_error_message());
    CHECK(back && ctrl_model_cfg(back)->num_labels == 1 && ctrl_model_cfg(back)->pad_token_id == 0);
    ctrl_model_free(back), ctrl_model_free(m);
    cJSON_Delete(before), cJSON_Delete(after);
    rm_rf(out);
}

TEST(max_shard_size_parsing) {
    static const struct {
        const char *text;
        int64_t bytes;
    } ok[] = {{"50GB", 50000000000LL},  {"5gb", 5000000000LL}, {"500MB", 500000000LL}, {"1.5KB", 1500},
              {"2TB", 2000000000000LL}, {"4096", 4096},        {"0.5 MB", 500000}};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        int64_t v = 0;
        CHECK_MSG(ctrl_parse_shard_size(ok[i].text, &v) == CTRL_OK && v == ok[i].bytes, "%s -> %lld",
                  ok[i].text, (long long)v);
    }
    static const char *const bad[] = {"", "5GiB", "KB", "0", "-1", "0KB", "5 XB", "five GB", "1e30GB"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int64_t v = 0;
        CHECK_MSG(ctrl_parse_shard_size(bad[i], &v) == CTRL_ERR_CONFIG, "'%s' accepted", bad[i]);
    }
}

TEST(train_save_keys) {
    ctrl_registry *reg = test_plugin_registry();
    char ini[1024];
    snprintf(ini, sizeof ini,
             "[model]\npath = %s/save/llama_fp32\n[train]\nsave_dtype = bf16\nsave_max_shard_size = 2.5MB\n",
             CTRL_FIXTURE_DIR);
    ctrl_config *cfg = test_config_from_text(reg, "save_ok.ini", ini);
    if (cfg) {
        const ctrl_run_settings *s = ctrl_config_settings(cfg);
        CHECK_STR(s->train.save_dtype, "bf16");
        CHECK(s->train.save_max_shard_bytes == 2500000);
        ctrl_config_free(cfg);
    }
    snprintf(ini, sizeof ini, "[model]\npath = %s/save/llama_fp32\n[train]\nsave_max_shard_size = 5GiB\n",
             CTRL_FIXTURE_DIR);
    test_config_refused(reg, "save_bad.ini", ini, "save_bad.ini:4: [train] save_max_shard_size: '5GiB'");
    snprintf(ini, sizeof ini, "[model]\npath = %s/save/llama_fp32\n[train]\nsave_dtype = fp8\n",
             CTRL_FIXTURE_DIR);
    test_config_refused(reg, "save_bad.ini", ini, "save_bad.ini:4: [train] save_dtype");
    snprintf(ini, sizeof ini,
             "[model]\npath = %s/save/llama_fp32\n[train]\nsave_dtype = bf16\n[peft]\nenabled = true\n",
             CTRL_FIXTURE_DIR);
    test_config_refused(reg, "save_bad.ini", ini,
                        "save_bad.ini:4: [train] save_dtype = bf16 with [peft] enabled");
    ctrl_registry_destroy(reg);
}

/* chat_template.jinja, when there, is the template (ahead of tokenizer_config.json's, as
 * transformers reads them); the tokenizer files a save carries are copied, and a run's
 * [data] chat_template_path becomes the saved chat_template.jinja. */
TEST(chat_template_jinja_read_and_copied) {
    char src[] = "/tmp/ctrl-tok-XXXXXX", dst[] = "/tmp/ctrl-tok-XXXXXX", path[1200], cmd[2400];
    CHECK(mkdtemp(src) != NULL && mkdtemp(dst) != NULL);
    snprintf(cmd, sizeof cmd, "cp %s/tokenizer/tiny_bpe/tokenizer.json %s/ && echo merges > %s/merges.txt",
             CTRL_FIXTURE_DIR, src, src);
    CHECK(system(cmd) == 0);
    snprintf(path, sizeof path, "%s/tokenizer_config.json", src);
    FILE *f = fopen(path, "w");
    fputs("{\"chat_template\": \"from tokenizer_config\"}", f);
    fclose(f);
    ctrl_tokenizer *t = NULL;
    CHECK_MSG(ctrl_tokenizer_load(src, &t) == CTRL_OK, "%s", ctrl_error_message());
    if (t) CHECK_STR(ctrl_tokenizer_chat_template(t), "from tokenizer_config");
    ctrl_tokenizer_free(t);
    snprintf(path, sizeof path, "%s/chat_template.jinja", src);
    f = fopen(path, "w");
    fputs("{{ messages[0].content }} from the jinja file", f);
    fclose(f);
    CHECK_MSG(ctrl_tokenizer_load(src, &t) == CTRL_OK, "%s", ctrl_error_message());
    if (t) CHECK_STR(ctrl_tokenizer_chat_template(t), "{{ messages[0].content }} from the jinja file");
    ctrl_tokenizer_free(t);
    CHECK_EQ_INT(ctrl_copy_tokenizer_files(src, dst), CTRL_OK);
    static const char *const files[] = {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
                                        "merges.txt"};
    for (int i = 0; i < 4; i++) {
        char a[1200], b[1200];
        snprintf(a, sizeof a, "%s/%s", src, files[i]);
        snprintf(b, sizeof b, "%s/%s", dst, files[i]);
        CHECK_MSG(same_file(a, b), "%s not copied", files[i]);
    }
    CHECK_EQ_INT(count_files(dst), 4);
    snprintf(path, sizeof path, "%s/custom.jinja", src);
    f = fopen(path, "w");
    fputs("custom template", f);
    fclose(f);
    CHECK_EQ_INT(ctrl_save_chat_template(path, dst), CTRL_OK);
    CHECK_MSG(ctrl_tokenizer_load(dst, &t) == CTRL_OK, "%s", ctrl_error_message());
    if (t) CHECK_STR(ctrl_tokenizer_chat_template(t), "custom template");
    ctrl_tokenizer_free(t);
    CHECK_EQ_INT(ctrl_save_chat_template("/nonexistent/x.jinja", dst), CTRL_ERR_IO);
    rm_rf(src), rm_rf(dst);
}

/* A run from a bf16 model: output_dir gets the model in bf16 (save_dtype = auto), sharded at
 * save_max_shard_size, config.json byte for byte the source's, the tokenizer files, and the run's
 * chat template as chat_template.jinja; its checkpoint keeps fp32 weights. */
TEST(training_run_saves_in_the_source_dtype_sharded) {
    const char *tmp = test_tmp_dir();
    if (!tmp) TEST_SKIP("no temporary directory");
    char src[1024], model[1100], out[1100], ini[1100], tmpl[1100], path[1300];
    snprintf(src, sizeof src, "%s/trl_sft/model", CTRL_FIXTURE_DIR);
    snprintf(model, sizeof model, "%s/bf16_model", tmp);
    snprintf(out, sizeof out, "%s/bf16_run", tmp);
    ctrl_model *m = NULL;
    CHECK_EQ_INT(ctrl_model_load(src, NULL, &m), CTRL_OK);
    if (!m) return;
    CHECK_EQ_INT(ctrl_model_save(m, model, CTRL_BF16), CTRL_OK); /* the source: a bf16 model */
    CHECK_EQ_INT(ctrl_copy_tokenizer_files(src, model), CTRL_OK);
    ctrl_model_free(m);
    snprintf(tmpl, sizeof tmpl, "%s/custom.jinja", tmp);
    FILE *f = fopen(tmpl, "w");
    fputs("{% for m in messages %}{{ m.content }}{% endfor %}", f);
    fclose(f);
    snprintf(ini, sizeof ini, "%s/bf16_run.ini", tmp);
    f = fopen(ini, "w");
    fprintf(
        f,
        "[run]\noutput_dir = %s\ndevice = cpu\n[model]\npath = %s\nattention = eager\n[data]\ntrain_file = "
        "%s/trl_sft/prompt_completion.jsonl\nmax_length = 32\nchat_template_path = %s\n[train]\ndtype = "
        "fp32\n"
        "max_steps = 2\nsave_steps = 2\nper_device_train_batch_size = 2\nreport_to = none\n"
        "save_max_shard_size = 100KB\n",
        out, model, CTRL_FIXTURE_DIR, tmpl);
    fclose(f);
    mkdir(out, 0755);
    const ctrl_status st = test_train_ini(ini, NULL, 0);
    CHECK_MSG(st == CTRL_OK, "%s", ctrl_error_message());
    if (st != CTRL_OK) return;
    CHECK(exists(out, "model.safetensors.index.json") && !exists(out, "model.safetensors"));
    int shards = 0;
    DIR *d = opendir(out);
    for (struct dirent *e; d && (e = readdir(d));)
        if (!strncmp(e->d_name, "model-", 6)) {
            char p[1400];
            snprintf(p, sizeof p, "%s/%s", out, e->d_name);
            ctrl_safetensors *s = NULL;
            CHECK_EQ_INT(ctrl_safetensors_open(p, &s), CTRL_OK);
            for (int i = 0; s && i < ctrl_safetensors_count(s); i++)
                CHECK_MSG(ctrl_safetensors_at(s, i)->dtype == CTRL_BF16, "%s: not bf16", p);
            ctrl_safetensors_close(s);
            shards++;
        }
    if (d) closedir(d);
    CHECK_MSG(shards > 1, "%d shards", shards);
    char a[1300], b[1300];
    snprintf(a, sizeof a, "%s/config.json", out), snprintf(b, sizeof b, "%s/config.json", model);
    CHECK(same_file(a, b));
    snprintf(a, sizeof a, "%s/tokenizer.json", out), snprintf(b, sizeof b, "%s/tokenizer.json", model);
    CHECK(same_file(a, b));
    snprintf(a, sizeof a, "%s/chat_template.jinja", out);
    CHECK(same_file(a, tmpl));
    snprintf(path, sizeof path, "%s/checkpoint-2", out);
    ctrl_dtype dt = CTRL_BF16;
    CHECK_EQ_INT(ctrl_model_dir_dtype(path, &dt), CTRL_OK);
    CHECK_MSG(dt == CTRL_F32, "the checkpoint's weights are %s", ctrl_dtype_name(dt));
    ctrl_model *back = NULL; /* and the saved model loads */
    CHECK_MSG(ctrl_model_load(out, NULL, &back) == CTRL_OK, "%s", ctrl_error_message());
    ctrl_model_free(back);
}
