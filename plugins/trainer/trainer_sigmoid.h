/* The logistic sigmoid 1 / (1 + e^-x), computed without overflow for either sign of x: what the
 * preference trainers' losses (dpo, kto) and their gradients are written with. */
#ifndef CTRL_PLUGINS_TRAINER_SIGMOID_H
#define CTRL_PLUGINS_TRAINER_SIGMOID_H

#include <math.h>

static inline double trainer_sigmoid(double x) { return x >= 0 ? 1 / (1 + exp(-x)) : exp(x) / (1 + exp(x)); }

#endif
