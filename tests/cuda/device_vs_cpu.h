/* A training run on the device against the same run on the CPU (tests/cuda: test_cuda_online.c,
 * test_cuda_trainers.c): the two runs' metrics.jsonl and saved weights compared, and the log of a
 * run captured. */
#ifndef CTRL_TESTS_CUDA_DEVICE_VS_CPU_H
#define CTRL_TESTS_CUDA_DEVICE_VS_CPU_H

#include <cJSON.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cuda_test.h"
#include "cuda/cuda_ops.h"
#include "device/cuda_backend.h"
#include "file_text.h"
#include "model/safetensors.h"
#include "test.h"

/* DIR/NAME read whole (NULL after a failed CHECK when missing). */
static inline char *read_file(const char *dir, const char *name) {
    char path[1400];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    ctrl_status st;
    char *t = ctrl_read_text_file(path, 1 << 22, &st);
    CHECK_MSG(t != NULL, "%s missing", path);
    return t;
}

static inline int skipped_metric(const char *k) {
    return !strncmp(k, "timing/", 7) || !strcmp(k, "step_time") || !strcmp(k, "tokens_per_second") ||
           strstr(k, "runtime") || strstr(k, "per_second");
}

/* Every metric of every line of a (the device's run) against b (the CPU's) within 1e-4 relative +
 * 1e-6 absolute; the worst relative difference of the values above 1e-3. */
static inline double compare_metrics(const char *what, const char *a, const char *b) {
    double worst = 0;
    int lines = 0;
    char *ca = strdup(a), *cb = strdup(b), *sa, *sb;
    for (char *la = strtok_r(ca, "\n", &sa), *lb = strtok_r(cb, "\n", &sb); la && lb;
         la = strtok_r(NULL, "\n", &sa), lb = strtok_r(NULL, "\n", &sb)) {
        cJSON *x = cJSON_Parse(la), *y = cJSON_Parse(lb);
        lines++;
        for (const cJSON *v = y ? y->child : NULL; v; v = v->next) {
            if (skipped_metric(v->string)) continue;
            const cJSON *u = cJSON_GetObjectItem(x, v->string);
            if (cJSON_IsNull(v)) {
                CHECK_MSG(cJSON_IsNull(u), "%s: %s is null on the CPU, not on the device", what, v->string);
                continue;
            }
            if (!cJSON_IsNumber(v)) continue;
            CHECK_MSG(cJSON_IsNumber(u), "%s: %s missing on the device (line %d)", what, v->string, lines);
            if (!cJSON_IsNumber(u)) continue;
            const double d = fabs(u->valuedouble - v->valuedouble);
            CHECK_MSG(d <= 1e-4 * fabs(v->valuedouble) + 1e-6,
                      "%s line %d: %s %.9g on the device, %.9g on the CPU", what, lines, v->string,
                      u->valuedouble, v->valuedouble);
            if (fabs(v->valuedouble) > 1e-3) worst = fmax(worst, d / fabs(v->valuedouble));
        }
        cJSON_Delete(x), cJSON_Delete(y);
    }
    CHECK_MSG(lines >= 3, "%s: %d metrics lines", what, lines);
    free(ca), free(cb);
    return worst;
}

/* The weights each run saved (model.safetensors, or a LoRA run's adapter_model.safetensors): the same
 * tensors, every value within 5e-5 absolute (each step moves a weight by up to lr = 1e-3; AdamW's
 * m / sqrt(v) amplifies the backends' rounding where a gradient is near zero); the worst difference. */
static inline double compare_weights(const char *what, const char *dev_dir, const char *cpu_dir) {
    char pa[1400], pb[1400];
    const char *file = "model.safetensors";
    snprintf(pb, sizeof pb, "%s/%s", cpu_dir, file);
    if (access(pb, R_OK) != 0)
        file = "adapter_model.safetensors", snprintf(pb, sizeof pb, "%s/%s", cpu_dir, file);
    snprintf(pa, sizeof pa, "%s/%s", dev_dir, file);
    ctrl_safetensors *a = NULL, *b = NULL;
    CHECK_MSG(ctrl_safetensors_open(pa, &a) == CTRL_OK, "%s: %s", what, ctrl_error_message());
    CHECK_MSG(ctrl_safetensors_open(pb, &b) == CTRL_OK, "%s: %s", what, ctrl_error_message());
    double worst = 0;
    const int n = b ? ctrl_safetensors_count(b) : 0;
    CHECK_MSG(a && b && ctrl_safetensors_count(a) == n && n > 0, "%s: the saved %s differ in their tensors",
              what, file);
    for (int i = 0; a && b && i < n; i++) {
        const ctrl_st_tensor *t = ctrl_safetensors_at(b, i);
        int64_t numel = 1;
        for (int d = 0; d < t->ndim; d++) numel *= t->shape[d];
        float *x = malloc(sizeof(float) * (size_t)numel), *y = malloc(sizeof(float) * (size_t)numel);
        const int ok = x && y && ctrl_safetensors_read_f32(a, t->name, x, numel) == CTRL_OK &&
                       ctrl_safetensors_read_f32(b, t->name, y, numel) == CTRL_OK;
        CHECK_MSG(ok, "%s: %s: %s", what, t->name, ctrl_error_message());
        for (int64_t j = 0; ok && j < numel; j++) worst = fmax(worst, fabs((double)x[j] - y[j]));
        free(x), free(y);
    }
    CHECK_MSG(worst <= 5e-5, "%s: saved weights differ by up to %.3g", what, worst);
    ctrl_safetensors_close(a), ctrl_safetensors_close(b);
    return worst;
}

/* stderr into `path` while a run prints its log there; stderr_restore(the fd it returned) after. */
static inline int stderr_to(const char *path) {
    fflush(stderr);
    const int keep = dup(2), fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (keep < 0 || fd < 0) {
        if (keep >= 0) close(keep);
        if (fd >= 0) close(fd);
        return -1;
    }
    dup2(fd, 2);
    close(fd);
    return keep;
}

static inline void stderr_restore(int keep) {
    fflush(stderr);
    if (keep < 0) return;
    dup2(keep, 2);
    close(keep);
}

#endif
