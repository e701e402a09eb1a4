/* Checks of CUDA runtime and cuBLAS calls: on failure, set the error with file:line and return. */
#ifndef CTRL_CORE_CUDA_CHECK_H
#define CTRL_CORE_CUDA_CHECK_H

#ifdef CTRL_HAVE_CUDA
#include <cuda_runtime.h>

#include <ctrl/status.h>

#define CTRL_CUDA_CHECK(call)                                                                                \
    do {                                                                                                     \
        cudaError_t err_ = (call);                                                                           \
        if (err_ != cudaSuccess)                                                                             \
            return ctrl_error_set(CTRL_ERR_DEVICE, "%s:%d: %s: %s", __FILE__, __LINE__, #call,               \
                                  cudaGetErrorString(err_));                                                 \
    } while (0)

/* After a kernel launch: launch-configuration errors now, execution errors at the next sync. */
#define CTRL_CUDA_CHECK_LAUNCH() CTRL_CUDA_CHECK(cudaGetLastError())

#define CTRL_CUBLAS_CHECK(call)                                                                              \
    do {                                                                                                     \
        int st_ = (int)(call);                                                                               \
        if (st_ != 0)                                                                                        \
            return ctrl_error_set(CTRL_ERR_DEVICE, "%s:%d: %s: cuBLAS status %d", __FILE__, __LINE__, #call, \
                                  st_);                                                                      \
    } while (0)
#endif

#endif
