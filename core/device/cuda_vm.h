/* The CUDA backend's sparse device memory (cuda_vm.c; backend.h's vm_reserve, vm_map, vm_unmap,
 * vm_unreserve, for ZeRO-3 on a device). */
#ifndef CTRL_CORE_CUDA_VM_H
#define CTRL_CORE_CUDA_VM_H

#include <stddef.h>

#include <ctrl/status.h>

ctrl_status ctrl_cuda_vm_reserve(void **ptr, size_t bytes, size_t *granularity);
ctrl_status ctrl_cuda_vm_map(void *ptr, size_t bytes);
ctrl_status ctrl_cuda_vm_unmap(void *ptr, size_t bytes);
void ctrl_cuda_vm_unreserve(void *ptr, size_t bytes);

#endif
