/* The CUDA backend's side stream (cuda_side_stream.c): copies between page-locked host memory and
 * the device that overlap the compute stream's kernels, ordered by events (backend.h's side_copy
 * and side_wait, for activation offloading). */
#ifndef CTRL_CORE_CUDA_SIDE_STREAM_H
#define CTRL_CORE_CUDA_SIDE_STREAM_H

#include <stddef.h>

#include <ctrl/status.h>

#define CTRL_CUDA_SIDE_EVENTS 4

ctrl_status ctrl_cuda_side_copy(void *dst, const void *src, size_t bytes, int to_device, int ev);
ctrl_status ctrl_cuda_side_wait(int ev);

#endif
