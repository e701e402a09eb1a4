/* Token embedding: a row gather forward, a scatter-add backward. */
#include <string.h>

#include "cpu/cpu_ops.h"

void ctrl_cpu_embedding_forward(float *out, const int32_t *tokens, const float *wte, int T, int C) {
#pragma omp parallel for schedule(static)
    for (int t = 0; t < T; t++)
        memcpy(out + (size_t)t * C, wte + (size_t)tokens[t] * C, sizeof(float) * (size_t)C);
}

void ctrl_cpu_embedding_backward(float *dwte, const float *dout, const int32_t *tokens, int T, int C) {
    /* Parallel over channels: a token id repeated in the batch accumulates without races, in
     * token order, so the result does not depend on the thread count. */
#pragma omp parallel for schedule(static)
    for (int c = 0; c < C; c++)
        for (int t = 0; t < T; t++) /* a negative id contributes nothing (nn.Embedding's padding_idx) */
            if (tokens[t] >= 0) dwte[(size_t)tokens[t] * C + c] += dout[(size_t)t * C + c];
}
