/* The CUDA device as the tests in tests/cuda take it: selected once, and the runtime's cache and
 * library handles given back at exit (ctrl_cuda_shutdown, registered after the runtime's first call
 * so that it runs before the runtime's own teardown), so that compute-sanitizer's leak check
 * reports only real leaks. */
#ifndef CTRL_TESTS_CUDA_CUDA_TEST_H
#define CTRL_TESTS_CUDA_CUDA_TEST_H

#include <stdlib.h>

#include "cuda/cuda_ops.h"
#include "device/backend.h"
#include "device/cuda_backend.h"

/* 1 when a GPU (or the CUDA emulator) can be used. */
static inline int need_gpu(void) {
    static int state = -1;
    if (state < 0) {
        state = ctrl_cuda_device_count() > 0 && ctrl_cuda_backend_ops() != NULL;
        if (state) atexit(ctrl_cuda_shutdown);
    }
    return state;
}

/* The CUDA backend's ops, as a run selects them (`[run] device = cuda`); NULL, with the reason in
 * ctrl_error_message(), where no device can be used. */
static inline const ctrl_backend_ops *cuda_test_ops(void) {
    ctrl_device dev;
    const ctrl_cuda_backend *cuda = NULL;
    if (ctrl_device_select("cuda", &dev, &cuda) != CTRL_OK || !cuda) return NULL;
    need_gpu();
    return cuda->ops;
}

#endif
