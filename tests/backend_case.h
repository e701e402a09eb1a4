/* The model on a backend against the model on the CPU backend, shared by
 * tests/unit/test_model_backend.c (a staged host backend: bit-identical) and
 * tests/cuda/test_cuda_model.c (the CUDA backend, natively or under issue 20's emulation: within
 * fp32 tolerances). A fixture model (tests/fixtures/models/ARCH) is loaded twice, one copy placed
 * on `be` with ctrl_model_to_device, and both run the same sequence on a packed batch of three
 * sequences: a forward (log-probs, entropies, accuracy flags) and backward; the parameters nudged
 * and ctrl_model_weights_changed, a second forward and backward; temperature 0.7 and the fused
 * forward (SFT's step) with backward(NULL); the gradients of all three accumulated and brought to
 * the host. With `checkpointing` the `checkpointing` memory plugin recomputes every layer. */
#ifndef CTRL_TEST_BACKEND_CASE_H
#define CTRL_TEST_BACKEND_CASE_H

#include <ctrl/tensor.h>

#include "device/backend.h"

/* tol_logp / tol_grad: relative L2 errors allowed (log-probs and entropies / each parameter's
 * gradient); 0 requires bit-identical results (accuracy flags too). CHECKs and prints the worst. */
/* 1: backend_case_check runs both models with bf16 compute (ctrl_model_set_compute_dtype). */
extern int backend_case_bf16;
void backend_case_check(const ctrl_backend_ops *be, ctrl_device device, const char *arch,
                        const char *attention, int checkpointing, double tol_logp, double tol_grad);
/* The sequence-classification head (tests/fixtures/score/ARCH) on `be` against the CPU: scores and
 * every gradient within `tol` relative (0: bit-identical). */
void backend_score_check(const ctrl_backend_ops *be, ctrl_device device, const char *arch, double tol);

/* LoRA adapters (dropout on, modules_to_save lm_head where untied) on tests/fixtures/models/ARCH: on
 * `be` against the CPU, log-probs and trainable gradients within `tol` (0: bit-identical). */
void backend_lora_check(const ctrl_backend_ops *be, ctrl_device device, const char *arch, double tol);
/* A LoRA adapter with modules_to_save (tests/fixtures/lora/ADAPTER over models/ARCH), its trained table
 * `view` scaled away from the base's, on `be` (NULL: the CPU): with the adapters off the log-probs are
 * the base model's bit for bit (PEFT's disable_adapter() runs the original module), on again the
 * adapter's bit for bit, and the adapter saved after an adapters-off forward holds the trained table. */
void backend_saved_off_check(const ctrl_backend_ops *be, ctrl_device device, const char *adapter,
                             const char *arch, const char *view);
/* The same with the base in NF4 (QLoRA, [peft] quantization = nf4), plain LoRA adapters. */
void backend_qlora_check(const ctrl_backend_ops *be, ctrl_device device, const char *arch, double tol);
/* And QDoRA: DoRA adapters (magnitudes, weight norms) over the NF4 base. */
void backend_qdora_check(const ctrl_backend_ops *be, ctrl_device device, const char *arch, double tol);

#endif
