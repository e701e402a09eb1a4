/* The `paged` plugin's CUDA path (paged_cuda.cu): fp32 queries over an fp32 or bf16 cache on a CUDA
 * device, head_dim <= 128. */
#ifndef CTRL_PAGED_CUDA_H
#define CTRL_PAGED_CUDA_H

#include <ctrl/plugin_api.h>

int paged_cuda_supported(const ctrl_paged_attention_args *a);
ctrl_status paged_cuda_forward(const ctrl_paged_attention_args *a);

#endif
