/* The flash plugin's CUDA path (flash_cuda.cu): fp32 or bf16 on a CUDA device, head_dim <= 128. */
#ifndef CTRL_FLASH_CUDA_H
#define CTRL_FLASH_CUDA_H

#include <ctrl/plugin_api.h>

int flash_cuda_supported(const ctrl_attention_args *a);
ctrl_status flash_cuda_forward(const ctrl_attention_args *a);
ctrl_status flash_cuda_backward(const ctrl_attention_args *a);
/* The GEMM path (flash_cuda_gemm.cu): available when the core lends a device GEMM
 * (ctrl_device_kernels.gemm). Which path flash_cuda_forward/backward take: flash_cuda.cu
 * (CTRL_FLASH_PATH). */
int flash_cuda_gemm_available(const ctrl_attention_args *a);
ctrl_status flash_cuda_gemm_forward(const ctrl_attention_args *a);
ctrl_status flash_cuda_gemm_backward(const ctrl_attention_args *a);
/* The tensor-core path (flash_cuda_mma.cu): fused mma.sync kernels for bf16 (or fp32 tensors with
 * compute_bf16) at head_dim 64 or 128. flash_cuda_mma_unsupported says why it cannot run these
 * arguments, or NULL when it can. */
const char *flash_cuda_mma_unsupported(const ctrl_attention_args *a);
ctrl_status flash_cuda_mma_forward(const ctrl_attention_args *a);
ctrl_status flash_cuda_mma_backward(const ctrl_attention_args *a);

#endif
