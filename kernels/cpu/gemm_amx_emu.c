/* The AMX micro-kernel of gemm_amx.c compiled a second time, its tile instructions emulated in
 * software (amx_emu.c, through amx_tile.h): the same source the hardware runs, run by the tests on
 * CPUs without AMX (CTRL_AMX_EMULATE=1 selects it; slow, for tests only). */
#define CTRL_AMX_EMULATED 1
#include "gemm_amx.c"
