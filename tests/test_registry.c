/* See test_registry.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "test.h"
#include "test_registry.h"
#include "file_text.h"
#include "generate/engine.h"
#include "train/train.h"

ctrl_registry *test_plugin_registry(void) {
    ctrl_registry *reg = NULL;
    CHECK_EQ_INT(ctrl_registry_create(&reg), CTRL_OK);
    const char *dirs[] = {CTRL_PLUGIN_DIR};
    CHECK_MSG(ctrl_registry_load_standard(reg, dirs, 1) == CTRL_OK, "plugins: %s", ctrl_error_message());
    return reg;
}

static ctrl_status load_text(const ctrl_registry *reg, const char *name, const char *ini, ctrl_config **cfg) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", test_tmp_dir(), name);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    *cfg = NULL;
    if (!f) return CTRL_ERR_IO;
    fputs(ini, f);
    fclose(f);
    return ctrl_config_load(path, NULL, 0, reg, cfg);
}

ctrl_config *test_config_from_text(const ctrl_registry *reg, const char *name, const char *ini) {
    ctrl_config *cfg;
    ctrl_status st = load_text(reg, name, ini, &cfg);
    CHECK_MSG(st == CTRL_OK, "%s: %s", name, ctrl_error_message());
    return st == CTRL_OK ? cfg : NULL;
}

void test_config_refused(const ctrl_registry *reg, const char *name, const char *ini, const char *want) {
    ctrl_config *cfg;
    ctrl_status st = load_text(reg, name, ini, &cfg);
    CHECK_MSG(st == CTRL_ERR_CONFIG && strstr(ctrl_error_message(), want),
              "%s: status %d, '%s' does not say '%s'", name, st, st ? ctrl_error_message() : "", want);
    ctrl_config_free(cfg);
}

static ctrl_registry *decoders;
static void free_decoders(void) { ctrl_registry_destroy(decoders); }

void test_attach_paged(ctrl_model *m) {
    if (!m) return;
    if (!decoders) {
        decoders = test_plugin_registry();
        atexit(free_decoders);
    }
    const ctrl_plugin *paged = NULL;
    CHECK_MSG(ctrl_registry_require(decoders, CTRL_KIND_ATTENTION, "paged", &paged) == CTRL_OK &&
                  ctrl_engine_attach_attention(m, paged) == CTRL_OK,
              "%s", ctrl_error_message());
}

int test_write_ini_template(const char *src_path, const char *dst_path, const char *const (*subs)[2],
                            int n_subs) {
    ctrl_status st;
    char *src = ctrl_read_text_file(src_path, 1 << 16, &st);
    FILE *f = src ? fopen(dst_path, "w") : NULL;
    if (!f) return free(src), -1;
    for (const char *p = src; *p;) {
        int i = 0;
        while (i < n_subs && strncmp(p, subs[i][0], strlen(subs[i][0]))) i++;
        if (i < n_subs)
            fputs(subs[i][1], f), p += strlen(subs[i][0]);
        else
            fputc(*p++, f);
    }
    free(src);
    return fclose(f) == 0 ? 0 : -1;
}

ctrl_status test_train_ini(const char *ini, const char *const *sets, int n_sets) {
    ctrl_registry *reg = test_plugin_registry();
    ctrl_config *cfg = NULL;
    ctrl_status st = ctrl_config_load(ini, sets, n_sets, reg, &cfg);
    if (st == CTRL_OK) st = ctrl_train_run(cfg, NULL);
    ctrl_config_free(cfg);
    ctrl_registry_destroy(reg);
    return st;
}

int test_read_curves(const char *out_dir, const char *trl_path, char **ours, char **theirs) {
    char path[1300];
    ctrl_status st;
    snprintf(path, sizeof path, "%s/metrics.jsonl", out_dir);
    *ours = ctrl_read_text_file(path, 1 << 20, &st);
    *theirs = ctrl_read_text_file(trl_path, 1 << 20, &st);
    CHECK_MSG(*ours && *theirs, "%s/metrics.jsonl or %s missing", out_dir, trl_path);
    if (*ours && *theirs) return 1;
    free(*ours), free(*theirs);
    *ours = *theirs = NULL;
    return 0;
}

ctrl_model *test_tiny_qwen2(const ctrl_registry *reg) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/models/qwen2", CTRL_FIXTURE_DIR);
    const ctrl_plugin_entry *e = ctrl_registry_find(reg, CTRL_KIND_ATTENTION, "flash");
    CHECK_MSG(e != NULL, "no flash attention plugin in %s", CTRL_PLUGIN_DIR);
    ctrl_model *m = NULL;
    if (e) CHECK_EQ_INT(ctrl_model_load(dir, e->plugin->ops, &m), CTRL_OK);
    return m;
}

int test_file_exists(const char *path) {
    FILE *f = fopen(path, "rb");
    if (f) fclose(f);
    return f != NULL;
}

const char *test_reward_model_dir(void) {
    static char dir[1024];
    if (dir[0]) return dir;
    snprintf(dir, sizeof dir, "%s/reward_model", test_tmp_dir());
    mkdir(dir, 0755);
    static const char *const files[][2] = {{"score/qwen2", "config.json"},
                                           {"score/qwen2", "model.safetensors"},
                                           {"tokenizer/tiny_bpe", "tokenizer.json"},
                                           {"tokenizer/tiny_bpe", "tokenizer_config.json"}};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char from[1200], to[1200];
        snprintf(from, sizeof from, "%s/%s/%s", CTRL_FIXTURE_DIR, files[i][0], files[i][1]);
        snprintf(to, sizeof to, "%s/%s", dir, files[i][1]);
        CHECK_MSG(symlink(from, to) == 0, "symlink %s", to);
    }
    return dir;
}
