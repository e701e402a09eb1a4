/* config.json -> the model config; a config small enough to allocate is also laid out as a model
 * (ctrl_model_create), which is where unchecked shapes would fail (docs/fuzzing.md). */
#include "fuzz_common.h"
#include "model/model.h"
#include "model/model_config.h"

/* Models above this many parameters are not allocated per input (the loader's own limits are
 * what is tested for them). */
#define FUZZ_MAX_PARAMS 4e6

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    fuzz_quiet();
    return 0;
}

static double param_estimate(const ctrl_model_config *c) {
    const double h = c->hidden_size, inter = c->intermediate_size, hd = c->head_dim;
    const double attn = h * hd * (c->n_heads + 2.0 * c->n_kv_heads) + hd * c->n_heads * h;
    return 2.0 * c->vocab_size * h + c->n_layers * (attn + 3.0 * h * inter + 2.0 * h + 2.0 * hd) + h;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[64];
    const int fd = fuzz_memfile(data, size, path, sizeof path);
    ctrl_model_config cfg;
    if (fd >= 0 && ctrl_model_config_load(path, &cfg) == CTRL_OK) {
        const double p = param_estimate(&cfg);
        if (p >= 0 && p <= FUZZ_MAX_PARAMS) {
            ctrl_model *m = NULL;
            if (ctrl_model_create(&cfg, NULL, &m) == CTRL_OK) ctrl_model_free(m);
        }
    }
    fuzz_file_close(fd);
    return 0;
}
