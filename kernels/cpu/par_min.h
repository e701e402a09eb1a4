/* The least work (elements a loop touches) for which a CPU kernel's loop runs in parallel. Below it
 * one thread finishes before the others would be awake: under OMP_WAIT_POLICY=PASSIVE the idle
 * threads sleep, and every parallel region wakes them and ends in a barrier (futex calls, tens of
 * microseconds on a busy machine). A decoding step of a few sequences is mostly such loops -- the
 * norms, rotations, adds and activations of a few rows between its GEMMs, in every layer; a
 * training step's are thousands of rows and stay parallel. Each element's arithmetic is the same at
 * any thread count (the loops split rows or elements, never a sum). */
#ifndef CTRL_KERNELS_CPU_PAR_MIN_H
#define CTRL_KERNELS_CPU_PAR_MIN_H

#define CTRL_CPU_PAR_MIN 65536

#endif
