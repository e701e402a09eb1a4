/* POST /update_weights: a safetensors body (f32, bf16 or f16) with some or all of the model's
 * parameters under their Hugging Face names. The whole body is validated first — the file's own
 * consistency through the untrusted-input reader, then every tensor's name, dtype, full shape and
 * values (finite) —
 * and only then is any weight written, so a refused body leaves the model exactly as it was. The
 * caller holds the engine between generations, so no generation sees half-updated weights. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model/safetensors.h"
#include "serve/serve_internal.h"

/* Whether tensor t can replace view v; a message in err otherwise. */
static int fits(const ctrl_st_tensor *t, const ctrl_param_view *v, char *err, size_t errcap) {
    if (!v) return snprintf(err, errcap, "tensor '%s' is not a parameter of this model", t->name), 0;
    if (t->dtype != CTRL_F32 && t->dtype != CTRL_BF16 && t->dtype != CTRL_F16)
        return snprintf(err, errcap, "tensor '%s' is %s: f32, bf16 or f16 expected (nothing was updated)",
                        t->name, ctrl_dtype_name(t->dtype)),
               0;
    int same = t->ndim == v->ndim;
    for (int d = 0; same && d < t->ndim; d++) same = t->shape[d] == v->shape[d];
    if (!same) {
        char want[64];
        snprintf(want, sizeof want, v->ndim == 1 ? "[%lld]" : "[%lld, %lld]", (long long)v->shape[0],
                 (long long)(v->ndim > 1 ? v->shape[1] : 0));
        return snprintf(err, errcap, "tensor '%s': shape does not match the model's %s (nothing was updated)",
                        t->name, want),
               0;
    }
    return 1;
}

/* Whether every value of t is finite (the weights never hold NaN or infinity: the loader refuses
 * them too); a message in err otherwise. */
static int finite(const ctrl_safetensors *st, const ctrl_st_tensor *t, char *err, size_t errcap) {
    float bad = 0;
    const int64_t at = ctrl_safetensors_find_non_finite(st, t, &bad);
    if (at < 0) return 1;
    return snprintf(err, errcap,
                    "tensor '%s' holds %g at element %lld: weights must be finite (nothing was updated)",
                    t->name, (double)bad, (long long)at),
           0;
}

static int apply(ctrl_model *m, const ctrl_safetensors *st, char *err, size_t errcap) {
    const int n = ctrl_safetensors_count(st);
    size_t most = 0; /* the largest weight held as bf16 panels (--dtype bf16): read aside, then packed */
    for (int i = 0; i < n; i++) { /* every tensor checked before anything is written */
        const ctrl_st_tensor *t = ctrl_safetensors_at(st, i);
        const ctrl_param_view *v = ctrl_model_find_view(m, t->name);
        if (!fits(t, v, err, errcap) || !finite(st, t, err, errcap)) return -1;
        if (ctrl_model_view_held(m, v) && (size_t)v->numel > most) most = (size_t)v->numel;
    }
    float *params = ctrl_model_params(m, NULL), *buf = most ? malloc(sizeof(float) * most) : NULL;
    if (most && !buf)
        return snprintf(err, errcap, "out of memory for a %zu-value weight (nothing was updated)", most), -1;
    for (int i = 0; i < n; i++) {
        const ctrl_st_tensor *t = ctrl_safetensors_at(st, i);
        const ctrl_param_view *v = ctrl_model_find_view(m, t->name);
        const int held = ctrl_model_view_held(m, v);
        float *to = held ? buf : params + v->offset;
        ctrl_status s = ctrl_safetensors_read_f32(st, t->name, to, v->numel);
        if (s == CTRL_OK && held) s = ctrl_model_write_view(m, v, to);
        if (s != CTRL_OK) {
            /* validated above: a failure here is a bug, and the weights are no longer whole */
            snprintf(err, errcap, "tensor '%s': %s", t->name, ctrl_error_message());
            ctrl_model_weights_changed(m);
            free(buf);
            return -1;
        }
    }
    free(buf);
    if (n > 0) ctrl_model_weights_changed(m);
    return n;
}

int serve_update_weights(ctrl_model *m, const char *data, size_t len, char *err, size_t errcap) {
    char path[] = "/tmp/ctrl-serve-weights-XXXXXX";
    const int fd = mkstemp(path);
    if (fd < 0) return snprintf(err, errcap, "cannot stage the weights: no temporary file"), -1;
    size_t at = 0;
    while (at < len) {
        const ssize_t w = write(fd, data + at, len - at);
        if (w <= 0) break;
        at += (size_t)w;
    }
    close(fd);
    ctrl_safetensors *st = NULL;
    int n = -1;
    if (at != len)
        snprintf(err, errcap, "cannot stage the weights (disk full?)");
    else if (ctrl_safetensors_open(path, &st) != CTRL_OK)
        snprintf(err, errcap, "the body is not a valid safetensors file: %s", ctrl_error_message());
    else
        n = apply(m, st, err, errcap);
    ctrl_safetensors_close(st);
    remove(path);
    return n;
}
