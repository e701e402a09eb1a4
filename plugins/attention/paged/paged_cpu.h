/* The `paged` plugin's CPU path (paged_cpu.c). */
#ifndef CTRL_PLUGIN_PAGED_CPU_H
#define CTRL_PLUGIN_PAGED_CPU_H

#include <ctrl/plugin_api.h>

/* fp32 on the host; CTRL_ERR_NOMEM (message set) when per-thread scratch could not be had. */
ctrl_status paged_cpu_forward(const ctrl_paged_attention_args *a);

#endif
