/* POST /update_weights for ctrl serve: a safetensors body (f32, bf16 or f16) with some or all of
 * the model's parameters under their Hugging Face names, checked whole (names, shapes, the file's
 * own consistency through the untrusted-input reader) before any weight changes, then copied in.
 * The server handles one request at a time, so no generation sees half-updated weights. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "model/safetensors.h"
#include "serve_weights.h"

int serve_update_weights(ctrl_model *m, const char *data, size_t len, char *err, size_t errcap) {
    char path[] = "/tmp/ctrl-serve-weights-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) return snprintf(err, errcap, "cannot stage the weights: no temporary file"), -1;
    const int wrote = write(fd, data, len) == (ssize_t)len;
    close(fd);
    ctrl_safetensors *st = NULL;
    int n = -1;
    if (!wrote)
        snprintf(err, errcap, "cannot stage the weights");
    else if (ctrl_safetensors_open(path, &st) != CTRL_OK)
        snprintf(err, errcap, "the body is not a valid safetensors file: %s", ctrl_error_message());
    else {
        n = ctrl_safetensors_count(st);
        for (int i = 0; i < n; i++) { /* every tensor checked before anything is written */
            const ctrl_st_tensor *t = ctrl_safetensors_at(st, i);
            const ctrl_param_view *v = ctrl_model_find_view(m, t->name);
            int64_t numel = 1;
            for (int d = 0; d < t->ndim; d++) numel *= t->shape[d];
            if (!v) {
                snprintf(err, errcap, "tensor '%s' is not a parameter of this model", t->name), n = -1;
                break;
            }
            if (numel != v->numel || t->ndim != v->ndim || t->shape[0] != v->shape[0]) {
                snprintf(err, errcap, "tensor '%s': shape does not match the model's", t->name), n = -1;
                break;
            }
        }
        float *params = ctrl_model_params(m, NULL);
        for (int i = 0; i < n; i++) {
            const ctrl_st_tensor *t = ctrl_safetensors_at(st, i);
            const ctrl_param_view *v = ctrl_model_find_view(m, t->name);
            if (ctrl_safetensors_read_f32(st, t->name, params + v->offset, v->numel) != CTRL_OK) {
                snprintf(err, errcap, "tensor '%s': %s", t->name, ctrl_error_message()), n = -1;
                break;
            }
        }
        ctrl_model_weights_changed(m);
        ctrl_safetensors_close(st);
    }
    remove(path);
    return n;
}
