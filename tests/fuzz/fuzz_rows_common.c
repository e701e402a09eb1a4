/* See fuzz_rows_common.h. */
#include "fuzz_rows_common.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_common.h"

static ctrl_tokenizer *tok;

const ctrl_tokenizer *fuzz_rows_tokenizer(void) {
    if (!tok && ctrl_tokenizer_load(CTRL_FIXTURE_DIR "/tokenizer/tiny_bpe", &tok) != CTRL_OK) {
        fprintf(stderr, "fuzz: %s\n", ctrl_error_message());
        abort();
    }
    return tok;
}

ctrl_config *fuzz_rows_config(const char *data_lines) {
    static ctrl_registry *reg;
    const char *dirs[] = {CTRL_PLUGIN_DIR};
    if (!reg &&
        (ctrl_registry_create(&reg) != CTRL_OK || ctrl_registry_load_standard(reg, dirs, 1) != CTRL_OK))
        abort();
    char ini[2048];
    snprintf(ini, sizeof ini,
             "[run]\noutput_dir = %s/out\n[model]\npath = " CTRL_FIXTURE_DIR "/models/qwen2\n[data]\n"
             "train_file = " CTRL_FIXTURE_DIR "/sft_data/text.jsonl\n%s\n",
             fuzz_scratch_dir(), data_lines);
    char path[64];
    const int fd = fuzz_memfile(ini, strlen(ini), path, sizeof path);
    ctrl_config *cfg = NULL;
    if (ctrl_config_load(path, NULL, 0, reg, &cfg) != CTRL_OK) {
        fprintf(stderr, "fuzz: config: %s\n", ctrl_error_message());
        abort();
    }
    fuzz_file_close(fd);
    return cfg;
}
