/* The emulated driver API's virtual memory management (include/cuda.h), over the host's: a reserved
 * range is an inaccessible mapping (PROT_NONE), cuMemMap puts fresh pages behind a piece of it, still
 * inaccessible until cuMemSetAccess makes them readable and writable, and filled with 0xff bytes (NaN
 * floats: a device's new memory is not zeroed, so a reader that forgot to write it first computes NaN),
 * cuMemUnmap hands the pages back to the system and makes the piece inaccessible again. So a kernel or a
 * copy that touches a piece not mapped -- a layer ZeRO-3 released -- faults at once (SIGSEGV), where a
 * GPU would raise an illegal address. The granularity is the host's page (a GPU's is 2 MiB). */
#include <cuda.h>
#include <cuda_runtime.h>

#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

namespace {
struct allocation {
    size_t size;
};
size_t page() { return (size_t)sysconf(_SC_PAGESIZE); }
bool aligned(unsigned long long v) { return v % page() == 0; }
} // namespace

extern "C" {

CUresult cuGetErrorString(CUresult error, const char **str) {
    switch (error) {
    case CUDA_SUCCESS: *str = "no error"; break;
    case CUDA_ERROR_INVALID_VALUE: *str = "invalid argument"; break;
    case CUDA_ERROR_OUT_OF_MEMORY: *str = "out of memory"; break;
    default: *str = "operation not supported"; break;
    }
    return CUDA_SUCCESS;
}

CUresult cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop,
                                       CUmemAllocationGranularity_flags option) {
    (void)prop, (void)option;
    *granularity = page();
    return CUDA_SUCCESS;
}

CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                             unsigned long long flags) {
    (void)alignment, (void)addr, (void)flags;
    if (!size || !aligned(size)) return CUDA_ERROR_INVALID_VALUE;
    void *p = mmap(NULL, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
    *ptr = (CUdeviceptr)(uintptr_t)p;
    return CUDA_SUCCESS;
}

CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
    return munmap((void *)(uintptr_t)ptr, size) == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                     unsigned long long flags) {
    (void)prop, (void)flags;
    if (!size || !aligned(size)) return CUDA_ERROR_INVALID_VALUE;
    *handle = (CUmemGenericAllocationHandle)(uintptr_t) new allocation{size};
    return CUDA_SUCCESS;
}

CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
    delete (allocation *)(uintptr_t)handle;
    return CUDA_SUCCESS;
}

CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                  unsigned long long flags) {
    (void)flags;
    const allocation *a = (const allocation *)(uintptr_t)handle;
    if (!a || offset || size != a->size || !aligned(ptr)) return CUDA_ERROR_INVALID_VALUE;
    void *p = (void *)(uintptr_t)ptr;
    if (mmap(p, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) == MAP_FAILED)
        return CUDA_ERROR_OUT_OF_MEMORY;
    memset(p, 0xff, size); /* not zeroed on a device */
    return mprotect(p, size, PROT_NONE) == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count) {
    if (!count || !aligned(ptr)) return CUDA_ERROR_INVALID_VALUE;
    const int prot = desc[0].flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE ? PROT_READ | PROT_WRITE : PROT_NONE;
    return mprotect((void *)(uintptr_t)ptr, size, prot) == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
    if (!aligned(ptr) || !aligned(size)) return CUDA_ERROR_INVALID_VALUE;
    void *p = mmap((void *)(uintptr_t)ptr, size, PROT_NONE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
    return p == MAP_FAILED ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

cudaError_t cudaGetDriverEntryPointByVersion(const char *symbol, void **funcPtr, unsigned int cudaVersion,
                                             unsigned long long flags,
                                             enum cudaDriverEntryPointQueryResult *status) {
    (void)cudaVersion, (void)flags;
    static const struct {
        const char *name;
        void *fn;
    } table[] = {
        {"cuGetErrorString", (void *)cuGetErrorString},
        {"cuMemGetAllocationGranularity", (void *)cuMemGetAllocationGranularity},
        {"cuMemAddressReserve", (void *)cuMemAddressReserve},
        {"cuMemAddressFree", (void *)cuMemAddressFree},
        {"cuMemCreate", (void *)cuMemCreate},
        {"cuMemRelease", (void *)cuMemRelease},
        {"cuMemMap", (void *)cuMemMap},
        {"cuMemUnmap", (void *)cuMemUnmap},
        {"cuMemSetAccess", (void *)cuMemSetAccess},
    };
    *funcPtr = NULL;
    if (status) *status = cudaDriverEntryPointSymbolNotFound;
    for (const auto &e : table)
        if (!strcmp(e.name, symbol)) {
            *funcPtr = e.fn;
            if (status) *status = cudaDriverEntryPointSuccess;
        }
    return cudaSuccess;
}

} // extern "C"
