/* SFT trained on a GPU (`[run] device = cuda`: the model's forward and backward on the device, the
 * optimizer on the host) against TRL's curves: every case of tests/e2e/test_trl_parity.c, with the
 * same tolerances. Skips, saying why, where no GPU can be used. */
#define TRL_PARITY_DEVICE "cuda"
#include "../e2e/test_trl_parity.c"
