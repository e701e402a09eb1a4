/* The CUDA backend's upload stream (cuda_upload_stream.c): host to device copies that run beside
 * the compute stream's kernels without waiting for them, ordered by per-copy events (backend.h's
 * upload_copy and upload_wait, for offload_optimizer's overlapped host step). */
#ifndef CTRL_CORE_CUDA_UPLOAD_STREAM_H
#define CTRL_CORE_CUDA_UPLOAD_STREAM_H

#include <stddef.h>

#include <ctrl/status.h>

ctrl_status ctrl_cuda_upload_copy(void *dst, const void *src, size_t bytes, int ev);
ctrl_status ctrl_cuda_upload_wait(int ev);
ctrl_status ctrl_cuda_host_register(void *ptr, size_t bytes);
void ctrl_cuda_host_unregister(void *ptr);

#endif
