/* POST /update_weights of ctrl serve (serve_weights.c). */
#ifndef CTRL_CLI_SERVE_WEIGHTS_H
#define CTRL_CLI_SERVE_WEIGHTS_H

#include <stddef.h>

#include "model/model.h"

/* Applies a safetensors body to the model; returns the number of tensors updated, or -1 with a
 * message in err (nothing applied when a name or shape is wrong). */
int serve_update_weights(ctrl_model *m, const char *data, size_t len, char *err, size_t errcap);

#endif
