/* A model fixture's packed batch (tests/fixtures/<models/ARCH or a folder>/batch.json, written by
 * tests/reference/make_model_fixtures.py and make_family_fixtures.py), for the model tests. */
#ifndef CTRL_TESTS_MODEL_FIXTURE_BATCH_H
#define CTRL_TESTS_MODEL_FIXTURE_BATCH_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json_file.h"
#include "model/model.h"

typedef struct fixture_batch {
    int T, n_cu;
    int32_t *tokens, *pos, *tg, *cu;
    ctrl_batch b;
} fixture_batch;

/* arch: a model of models/ ("qwen2"), or a folder under the fixtures ("families/phi3_gqa"). */
static inline void batch_load(fixture_batch *f, const char *arch) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s%s/batch.json", CTRL_FIXTURE_DIR, strchr(arch, '/') ? "" : "models/",
             arch);
    cJSON *root = json_file(path);
    int n;
    f->tokens = json_ints(root, "tokens", &f->T), f->pos = json_ints(root, "positions", &n);
    f->tg = json_ints(root, "targets", &n), f->cu = json_ints(root, "cu_seqlens", &f->n_cu);
    f->b = (ctrl_batch){.T = f->T,
                        .B = f->n_cu - 1,
                        .tokens = f->tokens,
                        .positions = f->pos,
                        .cu_seqlens = f->cu,
                        .targets = f->tg};
    cJSON_Delete(root);
}

static inline void batch_free(fixture_batch *f) { free(f->tokens), free(f->pos), free(f->tg), free(f->cu); }

#endif
