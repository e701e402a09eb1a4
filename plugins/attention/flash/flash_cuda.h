/* The flash plugin's CUDA path (flash_cuda.cu): fp32 or bf16 on a CUDA device, head_dim <= 128. */
#ifndef CTRL_FLASH_CUDA_H
#define CTRL_FLASH_CUDA_H

#include <ctrl/plugin_api.h>

int flash_cuda_supported(const ctrl_attention_args *a);
ctrl_status flash_cuda_forward(const ctrl_attention_args *a);
ctrl_status flash_cuda_backward(const ctrl_attention_args *a);
/* The GEMM path (flash_cuda_gemm.cu): available when the core lends a device GEMM
 * (ctrl_device_kernels.gemm) and CTRL_FLASH_TILED is unset; flash_cuda_forward/backward take it
 * then, the tiled SIMT kernels otherwise. */
int flash_cuda_gemm_available(const ctrl_attention_args *a);
ctrl_status flash_cuda_gemm_forward(const ctrl_attention_args *a);
ctrl_status flash_cuda_gemm_backward(const ctrl_attention_args *a);

#endif
