/* SFT trained on a GPU (`[run] device = cuda`: the model's forward and backward on the device, the
 * optimizer on the host) against TRL's curves: every case of tests/e2e/test_trl_parity.c, with the
 * same tolerances. Skips, saying why, where no GPU can be used. Under the CUDA emulator
 * (test_cuda_train_emu, CTRL_TEST_SMALL) only the cases that differ on the device run: padded and
 * padding-free attention, bf16, gradient accumulation, packed rows. */
#define TRL_PARITY_DEVICE "cuda"
#define TRL_PARITY_SMALL_CASES " padded padded_bf16 padding_free grad_accum bfd_packing "
#include "../e2e/test_trl_parity.c"
