/* CUDA devices and copies. Built without CUDA, the same functions say so. */
#include "cuda/cuda_ops.h"

#include <stdio.h>
#include <string.h>

#ifdef CTRL_HAVE_CUDA
#include "device/cuda_check.h"

static char unavailable[256];

int ctrl_cuda_built(void) { return 1; }

int ctrl_cuda_device_count(void) {
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess) {
        snprintf(unavailable, sizeof unavailable, "no CUDA device: %s", cudaGetErrorString(err));
        cudaGetLastError(); /* clear the sticky error so later calls are not confused by it */
        return 0;
    }
    if (n == 0) snprintf(unavailable, sizeof unavailable, "no CUDA device found");
    return n;
}

const char *ctrl_cuda_unavailable_reason(void) {
    if (!unavailable[0] && ctrl_cuda_device_count() > 0) return "";
    return unavailable;
}

ctrl_status ctrl_cuda_set_device(int index) {
    int n = ctrl_cuda_device_count();
    if (index < 0 || index >= n)
        return ctrl_error_set(CTRL_ERR_DEVICE, "cuda:%d: this machine has %d CUDA device(s)%s%s", index, n,
                              n ? "" : ": ", n ? "" : unavailable);
    CTRL_CUDA_CHECK(cudaSetDevice(index));
    return CTRL_OK;
}

ctrl_status ctrl_cuda_device_name(int index, char *buf, size_t cap) {
    struct cudaDeviceProp prop;
    CTRL_CUDA_CHECK(cudaGetDeviceProperties(&prop, index));
    snprintf(buf, cap, "%s (sm_%d%d, %d SMs, %.1f GiB)", prop.name, prop.major, prop.minor,
             prop.multiProcessorCount, (double)prop.totalGlobalMem / (1024.0 * 1024 * 1024));
    return CTRL_OK;
}

ctrl_status ctrl_cuda_memory_info(size_t *free_bytes, size_t *total_bytes) {
#ifdef CTRL_CUDA_EMU /* no driver to ask: the device's size less what the caching allocator holds */
    int dev = 0;
    struct cudaDeviceProp prop;
    CTRL_CUDA_CHECK(cudaGetDevice(&dev));
    CTRL_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
    ctrl_cuda_mem_stats s;
    ctrl_cuda_mem_stats_get(&s);
    *total_bytes = prop.totalGlobalMem;
    *free_bytes = prop.totalGlobalMem > s.reserved ? prop.totalGlobalMem - s.reserved : 0;
#else
    CTRL_CUDA_CHECK(cudaMemGetInfo(free_bytes, total_bytes));
#endif
    return CTRL_OK;
}

ctrl_status ctrl_cuda_synchronize(void) {
    CTRL_CUDA_CHECK(cudaDeviceSynchronize());
    return CTRL_OK;
}

ctrl_status ctrl_cuda_host_alloc(void **ptr, size_t bytes) {
    *ptr = NULL;
    CTRL_CUDA_CHECK(cudaMallocHost(ptr, bytes));
    return CTRL_OK;
}

void ctrl_cuda_host_free(void *ptr) {
    if (ptr) cudaFreeHost(ptr);
}

ctrl_status ctrl_cuda_memcpy_h2d(void *dst, const void *src, size_t bytes) {
    CTRL_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
    return CTRL_OK;
}

ctrl_status ctrl_cuda_memcpy_d2h(void *dst, const void *src, size_t bytes) {
    CTRL_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
    return CTRL_OK;
}

ctrl_status ctrl_cuda_memcpy_d2d(void *dst, const void *src, size_t bytes) {
    CTRL_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice));
    return CTRL_OK;
}

ctrl_status ctrl_cuda_memset(void *dst, int value, size_t bytes) {
    CTRL_CUDA_CHECK(cudaMemset(dst, value, bytes));
    return CTRL_OK;
}

#else /* built without CUDA */

#define NO_CUDA ctrl_error_set(CTRL_ERR_UNSUPPORTED, "this ctrl was built without CUDA")

int ctrl_cuda_built(void) { return 0; }
int ctrl_cuda_device_count(void) { return 0; }
const char *ctrl_cuda_unavailable_reason(void) { return "built without CUDA"; }
ctrl_status ctrl_cuda_set_device(int index) {
    (void)index;
    return NO_CUDA;
}
ctrl_status ctrl_cuda_device_name(int index, char *buf, size_t cap) {
    (void)index;
    if (cap) buf[0] = '\0';
    return NO_CUDA;
}
ctrl_status ctrl_cuda_synchronize(void) { return NO_CUDA; }
ctrl_status ctrl_cuda_memory_info(size_t *free_bytes, size_t *total_bytes) {
    *free_bytes = *total_bytes = 0;
    return NO_CUDA;
}
ctrl_status ctrl_cuda_host_alloc(void **ptr, size_t bytes) {
    (void)bytes;
    *ptr = NULL;
    return NO_CUDA;
}
void ctrl_cuda_host_free(void *ptr) { (void)ptr; }
ctrl_status ctrl_cuda_memcpy_h2d(void *dst, const void *src, size_t bytes) {
    (void)dst, (void)src, (void)bytes;
    return NO_CUDA;
}
ctrl_status ctrl_cuda_memcpy_d2h(void *dst, const void *src, size_t bytes) {
    (void)dst, (void)src, (void)bytes;
    return NO_CUDA;
}
ctrl_status ctrl_cuda_memcpy_d2d(void *dst, const void *src, size_t bytes) {
    (void)dst, (void)src, (void)bytes;
    return NO_CUDA;
}
ctrl_status ctrl_cuda_memset(void *dst, int value, size_t bytes) {
    (void)dst, (void)value, (void)bytes;
    return NO_CUDA;
}
ctrl_status ctrl_cuda_linear_forward_f32(float *out, const float *x, const float *w, const float *bias, int T,
                                         int IN, int OUT) {
    (void)out, (void)x, (void)w, (void)bias, (void)T, (void)IN, (void)OUT;
    return NO_CUDA;
}
ctrl_status ctrl_cuda_linear_forward_bf16(uint16_t *out, const uint16_t *x, const uint16_t *w, int T, int IN,
                                          int OUT) {
    (void)out, (void)x, (void)w, (void)T, (void)IN, (void)OUT;
    return NO_CUDA;
}
ctrl_status ctrl_cuda_f32_to_bf16(uint16_t *dst, const float *src, int64_t n) {
    (void)dst, (void)src, (void)n;
    return NO_CUDA;
}
ctrl_status ctrl_cuda_bf16_to_f32(float *dst, const uint16_t *src, int64_t n) {
    (void)dst, (void)src, (void)n;
    return NO_CUDA;
}
#endif
