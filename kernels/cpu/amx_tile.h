/* The thin layer the AMX kernel (gemm_amx.c) is written against: the tile instructions it uses, by
 * one name each, mapped to the compiler's intrinsics (the real instructions, in functions compiled
 * for amx-tile and amx-bf16) or, where CTRL_AMX_EMULATED is defined before this header
 * (gemm_amx_emu.c), to their software emulation (amx_emu.h). One kernel source, two builds: the
 * tests run the emulated one on CPUs without AMX. */
#ifndef CTRL_KERNELS_CPU_AMX_TILE_H
#define CTRL_KERNELS_CPU_AMX_TILE_H

#include "cpu/amx_emu.h" /* ctrl_amx_tilecfg, the configuration both builds load */

#ifdef CTRL_AMX_EMULATED
#define AMX_TARGET
#define AMX_LOADCONFIG(cfg) ctrl_amx_emu_loadconfig(cfg)
#define AMX_LOADD(t, base, stride) ctrl_amx_emu_loadd(t, base, (ptrdiff_t)(stride))
#define AMX_STORED(t, base, stride) ctrl_amx_emu_stored(t, base, (ptrdiff_t)(stride))
#define AMX_ZERO(t) ctrl_amx_emu_zero(t)
#define AMX_DPBF16PS(c, a, b) ctrl_amx_emu_dpbf16ps(c, a, b)
#define AMX_RELEASE() ctrl_amx_emu_release()
#define AMX_COMPILED 1
#elif defined(__x86_64__) &&                                                                                 \
    ((defined(__clang__) && __clang_major__ >= 12) || (!defined(__clang__) && __GNUC__ >= 11))
#include <immintrin.h>
#define AMX_TARGET __attribute__((target("amx-tile,amx-bf16")))
#define AMX_LOADCONFIG(cfg) _tile_loadconfig(cfg)
#define AMX_LOADD(t, base, stride) _tile_loadd(t, base, stride)
#define AMX_STORED(t, base, stride) _tile_stored(t, base, stride)
#define AMX_ZERO(t) _tile_zero(t)
#define AMX_DPBF16PS(c, a, b) _tile_dpbf16ps(c, a, b)
#define AMX_RELEASE() _tile_release()
#define AMX_COMPILED 1
#else
#define AMX_COMPILED 0 /* a compiler without the AMX intrinsics: no native kernel */
#endif

#endif
