/* Flash attention on the CPU (fp32): tiled online softmax, never materialising T x T. */
#ifndef CTRL_PLUGIN_FLASH_CPU_H
#define CTRL_PLUGIN_FLASH_CPU_H

#include <ctrl/plugin_api.h>

#define FLASH_BLOCK_Q 64
#define FLASH_BLOCK_K 64

ctrl_status flash_cpu_forward(const ctrl_attention_args *a);
ctrl_status flash_cpu_backward(const ctrl_attention_args *a);

#endif
