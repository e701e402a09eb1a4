/* See test_registry.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test.h"
#include "test_registry.h"
#include "file_text.h"
#include "generate/engine.h"

ctrl_registry *test_plugin_registry(void) {
    ctrl_registry *reg = NULL;
    CHECK_EQ_INT(ctrl_registry_create(&reg), CTRL_OK);
    const char *dirs[] = {CTRL_PLUGIN_DIR};
    CHECK_MSG(ctrl_registry_load_standard(reg, dirs, 1) == CTRL_OK, "plugins: %s", ctrl_error_message());
    return reg;
}

ctrl_config *test_config_from_text(const ctrl_registry *reg, const char *name, const char *ini) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", test_tmp_dir(), name);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (!f) return NULL;
    fputs(ini, f);
    fclose(f);
    ctrl_config *cfg = NULL;
    ctrl_status st = ctrl_config_load(path, NULL, 0, reg, &cfg);
    CHECK_MSG(st == CTRL_OK, "%s: %s", path, ctrl_error_message());
    return st == CTRL_OK ? cfg : NULL;
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
