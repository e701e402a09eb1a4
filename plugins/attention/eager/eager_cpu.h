/* The eager attention reference on the CPU (fp32): scores materialised per (sequence, head). */
#ifndef CTRL_PLUGIN_EAGER_CPU_H
#define CTRL_PLUGIN_EAGER_CPU_H

#include <ctrl/plugin_api.h>

ctrl_status eager_cpu_forward(const ctrl_attention_args *a);
ctrl_status eager_cpu_backward(const ctrl_attention_args *a);
#ifdef CTRL_HAVE_CUDA
/* fp32 on the device (eager_cuda.cu); args->cu_seqlens on the device, cu_seqlens_host on the host. */
ctrl_status eager_cuda_forward(const ctrl_attention_args *a);
ctrl_status eager_cuda_backward(const ctrl_attention_args *a);
#endif

#endif
