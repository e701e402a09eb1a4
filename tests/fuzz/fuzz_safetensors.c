/* safetensors: the header, the tensor table and reading every tensor as f32 (docs/fuzzing.md). */
#include <stdlib.h>

#include "fuzz_common.h"
#include "model/safetensors.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    fuzz_quiet();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[64];
    const int fd = fuzz_memfile(data, size, path, sizeof path);
    ctrl_safetensors *st = NULL;
    if (fd >= 0 && ctrl_safetensors_open(path, &st) == CTRL_OK) {
        for (int i = 0; i < ctrl_safetensors_count(st); i++) {
            const ctrl_st_tensor *t = ctrl_safetensors_at(st, i);
            if (ctrl_safetensors_find(st, t->name) == NULL) abort(); /* a listed name must be found */
            int64_t numel = 1;
            for (int d = 0; d < t->ndim; d++) numel *= t->shape[d];
            /* Accepted tensors lie inside the file, so numel is bounded by its size. */
            float *dst = malloc((size_t)(numel > 0 ? numel : 1) * sizeof(float));
            if (!dst) abort();
            (void)ctrl_safetensors_read_f32(st, t->name, dst, numel);
            free(dst);
        }
        ctrl_safetensors_close(st);
    }
    fuzz_file_close(fd);
    return 0;
}
