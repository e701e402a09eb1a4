/* ctrl's CUDA emulator: the part of the CUDA runtime API the project uses, over host memory with
 * synchronous calls, plus (in C++) the device-side vocabulary the kernels use: thread indices,
 * __shared__, __syncthreads, warp shuffles and votes, atomics, math intrinsics, and the launch
 * that the build-time rewrite of `k<<<g, b>>>(args)` calls. See kernels/cuda/emu/README.md. */
#ifndef CTRL_EMU_CUDA_RUNTIME_H
#define CTRL_EMU_CUDA_RUNTIME_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum cudaError {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorInvalidDevice = 101,
    cudaErrorLaunchFailure = 719,
} cudaError_t;

typedef enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4,
} cudaMemcpyKind;

typedef enum cudaFuncAttribute {
    cudaFuncAttributeMaxDynamicSharedMemorySize = 8,
} cudaFuncAttribute;

typedef struct CUstream_st *cudaStream_t;
typedef struct CUevent_st *cudaEvent_t;
#define cudaStreamDefault 0x00
#define cudaStreamNonBlocking 0x01
#define cudaEventDefault 0x00
#define cudaEventDisableTiming 0x02

struct cudaDeviceProp {
    char name[256];
    size_t totalGlobalMem;
    int major, minor;
    int multiProcessorCount;
    int warpSize;
    size_t sharedMemPerBlock;
    int maxThreadsPerBlock;
};

const char *cudaGetErrorString(cudaError_t err);
cudaError_t cudaGetLastError(void);
cudaError_t cudaPeekAtLastError(void);
cudaError_t cudaGetDeviceCount(int *count);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDevice(int *device);
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaMalloc(void **ptr, size_t bytes);
cudaError_t cudaFree(void *ptr);
cudaError_t cudaMallocHost(void **ptr, size_t bytes);
cudaError_t cudaFreeHost(void *ptr);
#define cudaHostRegisterDefault 0u
cudaError_t cudaHostRegister(void *ptr, size_t bytes, unsigned int flags);
cudaError_t cudaHostUnregister(void *ptr);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind, cudaStream_t s);
cudaError_t cudaMemset(void *dst, int value, size_t bytes);
cudaError_t cudaMemsetAsync(void *dst, int value, size_t bytes, cudaStream_t s);
cudaError_t cudaStreamCreate(cudaStream_t *s);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int flags);
/* The driver's functions by name (those of include/cuda.h, emu_vm.cpp). */
enum cudaDriverEntryPointQueryResult {
    cudaDriverEntryPointSuccess = 0,
    cudaDriverEntryPointSymbolNotFound = 1,
    cudaDriverEntryPointVersionNotSufficent = 2,
};
#define cudaEnableDefault 0x0
cudaError_t cudaGetDriverEntryPointByVersion(const char *symbol, void **funcPtr, unsigned int cudaVersion,
                                             unsigned long long flags,
                                             enum cudaDriverEntryPointQueryResult *status);
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int flags);
cudaError_t cudaEventCreate(cudaEvent_t *e);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned int flags);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s);
cudaError_t cudaEventSynchronize(cudaEvent_t e);
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end);

/* Emulator controls: the seed of the thread-order shuffle (CTRL_EMU_SEED in the environment sets
 * the initial one). */
void ctrl_emu_set_seed(uint64_t seed);
/* Emulator counters of the work a program hands the device (what a profiler's launch count says on a
 * GPU): kernel launches whose kernel name (as written at the launch, `k` or `k<T>`) contains
 * `name_part` (NULL: every launch), and cublasLtMatmul calls with fp32 operands (fp32 = 1) or bf16
 * operands (fp32 = 0). ctrl_emu_reset_counters sets them all to zero. */
long ctrl_emu_launches(const char *name_part);
long ctrl_emu_matmuls(int fp32);
void ctrl_emu_reset_counters(void);
/* Work other than a copy queued on a created stream (the emulated NCCL's collectives on a stream
 * other than 0): fn(arg) runs when the stream's queue reaches it -- when something waits for it, as a
 * queued copy does -- and a non-zero return makes the runtime's last error cudaErrorLaunchFailure.
 * Returns 0 when queued; -1 for stream 0 or one not created (the caller runs the work now).
 * ctrl_emu_stream_flush runs everything queued on s now (cudaStreamSynchronize without its error). */
int ctrl_emu_stream_defer(cudaStream_t s, int (*fn)(void *arg), void *arg);
void ctrl_emu_stream_flush(cudaStream_t s);

#ifdef __cplusplus
}
#include "ctrl_emu_device.h"
#endif

#endif
