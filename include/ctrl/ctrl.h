/* Umbrella header: the whole public API. */
#ifndef CTRL_CTRL_H
#define CTRL_CTRL_H

#include "attention.h"
#include "config.h"
#include "log.h"
#include "memory.h"
#include "optimizer.h"
#include "option.h"
#include "plugin.h"
#include "reward.h"
#include "status.h"
#include "tensor.h"
#include "trainer.h"
#include "version.h"

#endif
