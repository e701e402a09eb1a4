/* Model directories as untrusted input (issue 15): sharded weights must name each tensor once, and
 * model.safetensors.index.json must tell the truth about where each tensor is. The directories are
 * made here from the llama fixture's own weights. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"
#include "model/safetensors.h"
#include "test.h"

static ctrl_model *fixture(void) {
    ctrl_model *m = NULL;
    ctrl_status st = ctrl_model_load(CTRL_FIXTURE_DIR "/models/llama", NULL, &m);
    CHECK_MSG(st == CTRL_OK, "%s", ctrl_error_message());
    return m;
}

/* DIR/name/ holding the fixture's config.json. */
static const char *model_dir(const char *name) {
    static char dir[512];
    char cmd[1200];
    snprintf(dir, sizeof dir, "%s/%s", test_tmp_dir(), name);
    snprintf(cmd, sizeof cmd, "mkdir -p %s && cp %s/models/llama/config.json %s/", dir, CTRL_FIXTURE_DIR,
             dir);
    CHECK(system(cmd) == 0);
    return dir;
}

/* DIR/name/ with the fixture's config.json, and its tensors split into shard a (views < half) and
 * shard b (the rest, plus view `dup` again when >= 0); the index maps `lie` (when given) to
 * `lie_shard`. Returns the directory. */
static const char *sharded_dir(const char *name, ctrl_model *m, int dup, const char *lie,
                               const char *lie_shard) {
    const char *dir = model_dir(name);
    char path[700];
    const int nv = ctrl_model_view_count(m), half = nv / 2;
    float *params = ctrl_model_params(m, NULL);
    ctrl_st_write *w = calloc((size_t)nv + 1, sizeof *w);
    for (int i = 0; i < nv; i++) {
        const ctrl_param_view *v = ctrl_model_view(m, i);
        w[i] = (ctrl_st_write){.name = v->name, .data = params + v->offset, .ndim = v->ndim};
        w[i].shape[0] = v->shape[0], w[i].shape[1] = v->shape[1];
    }
    snprintf(path, sizeof path, "%s/a.safetensors", dir);
    CHECK_EQ_INT(ctrl_safetensors_write(path, w, half, CTRL_F32), CTRL_OK);
    int nb = nv - half;
    if (dup >= 0) w[nv] = w[dup], nb++;
    snprintf(path, sizeof path, "%s/b.safetensors", dir);
    CHECK_EQ_INT(ctrl_safetensors_write(path, w + half, nb, CTRL_F32), CTRL_OK);
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    FILE *f = fopen(path, "w");
    fprintf(f, "{\"metadata\": {}, \"weight_map\": {");
    for (int i = 0; i < nv; i++) {
        const char *shard = lie && !strcmp(w[i].name, lie) ? lie_shard
                            : i < half                     ? "a.safetensors"
                                                           : "b.safetensors";
        fprintf(f, "%s\"%s\": \"%s\"", i ? ", " : "", w[i].name, shard);
    }
    fprintf(f, "}}\n");
    fclose(f);
    free(w);
    return dir;
}

TEST(sharded_weights_load_as_the_single_file) {
    ctrl_model *m = fixture(), *s = NULL;
    if (!m) return;
    CHECK_EQ_INT(ctrl_model_load(sharded_dir("ok", m, -1, NULL, NULL), NULL, &s), CTRL_OK);
    size_t n = 0;
    const float *a = ctrl_model_params(m, &n);
    CHECK(s && memcmp(a, ctrl_model_params(s, NULL), n * sizeof(float)) == 0);
    ctrl_model_free(s);
    ctrl_model_free(m);
}

TEST(a_tensor_in_two_shards_is_refused) {
    ctrl_model *m = fixture(), *s = NULL;
    if (!m) return;
    CHECK_EQ_INT(ctrl_model_load(sharded_dir("dup", m, 0, NULL, NULL), NULL, &s), CTRL_ERR_FORMAT);
    CHECK(s == NULL);
    CHECK_CONTAINS(ctrl_error_message(),
                   "tensor 'model.embed_tokens.weight' is in both a.safetensors and b.safetensors");
    ctrl_model_free(m);
}

TEST(an_index_that_lies_is_refused) {
    ctrl_model *m = fixture(), *s = NULL;
    if (!m) return;
    const char *name = ctrl_model_view(m, 0)->name;
    CHECK_EQ_INT(ctrl_model_load(sharded_dir("lie", m, -1, name, "b.safetensors"), NULL, &s),
                 CTRL_ERR_FORMAT);
    CHECK_CONTAINS(ctrl_error_message(),
                   "weight_map puts 'model.embed_tokens.weight' in b.safetensors, which has no such tensor");
    CHECK_EQ_INT(ctrl_model_load(sharded_dir("dots", m, -1, name, ".."), NULL, &s), CTRL_ERR_FORMAT);
    CHECK_CONTAINS(ctrl_error_message(), "bad shard name for 'model.embed_tokens.weight'");
    ctrl_model_free(m);
}

/* DIR/name/ with the fixture's config.json and its weights as one file of `dtype`, where element
 * `at` of view `which` is `value`. */
static const char *poisoned_dir(const char *name, ctrl_model *m, int which, int64_t at, float value,
                                ctrl_dtype dtype) {
    const char *dir = model_dir(name);
    char path[700];
    size_t n = 0;
    ctrl_model_params(m, &n);
    float *copy = malloc(n * sizeof(float));
    memcpy(copy, ctrl_model_params(m, NULL), n * sizeof(float));
    const int nv = ctrl_model_view_count(m);
    ctrl_st_write *w = calloc((size_t)nv, sizeof *w);
    for (int i = 0; i < nv; i++) {
        const ctrl_param_view *v = ctrl_model_view(m, i);
        w[i] = (ctrl_st_write){.name = v->name, .data = copy + v->offset, .ndim = v->ndim};
        w[i].shape[0] = v->shape[0], w[i].shape[1] = v->shape[1];
        if (i == which) copy[v->offset + (size_t)at] = value;
    }
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    CHECK_EQ_INT(ctrl_safetensors_write(path, w, nv, dtype), CTRL_OK);
    free(w), free(copy);
    return dir;
}

TEST(non_finite_weights_are_refused_naming_the_tensor) {
    ctrl_model *m = fixture(), *s = NULL;
    if (!m) return;
    const int which = 3;
    const char *name = ctrl_model_view(m, which)->name;
    char want[300];
    static const float values[] = {NAN, INFINITY, -INFINITY};
    for (int d = 0; d < 2; d++)
        for (int k = 0; k < 3; k++) {
            const ctrl_dtype dtype = d ? CTRL_BF16 : CTRL_F32;
            CHECK_EQ_INT(ctrl_model_load(poisoned_dir("poison", m, which, 5 + k, values[k], dtype), NULL, &s),
                         CTRL_ERR_FORMAT);
            CHECK(s == NULL);
            snprintf(want, sizeof want, "tensor '%s' holds %g at element %d (weights must be finite)", name,
                     (double)values[k], 5 + k);
            CHECK_CONTAINS(ctrl_error_message(), want);
        }
    /* the largest finite values load */
    CHECK_EQ_INT(ctrl_model_load(poisoned_dir("big", m, which, 0, 3.0e38f, CTRL_F32), NULL, &s), CTRL_OK);
    ctrl_model_free(s);
    ctrl_model_free(m);
}
