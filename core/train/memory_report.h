/* Where a training run's memory goes (memory_report.c): the process's resident memory (VmRSS) and its
 * peak so far (VmHWM) read at the edges of the first step -- before it, after its forward/backward,
 * after its optimizer step -- and logged once with what the model accounts for itself (parameters,
 * gradients, activations, scratch, a bf16 copy). The optimizer's state is what the first step added
 * after the backward (its moments are first written there). Linux only; elsewhere nothing is logged. */
#ifndef CTRL_TRAIN_MEMORY_REPORT_H
#define CTRL_TRAIN_MEMORY_REPORT_H

#include "model/model.h"

typedef struct train_memory {
    double rss_kb[3], peak_kb[3]; /* before the step, after the forward/backward, after the optimizer */
    int marks;                    /* how many of them were read */
} train_memory;

/* Reads the process's VmRSS and VmHWM (kB) into *rss_kb and *peak_kb; 0 where unknown. */
void train_memory_read(double *rss_kb, double *peak_kb);
/* The next edge of the first step (call it 3 times: before, after the backward, after the optimizer). */
void train_memory_mark(train_memory *t);
/* Logs the report (INFO) once the three edges are read. sliced: NULL, or the parameters' and gradients'
 * resident bytes where zero3 holds slices of them (else their whole sizes are counted). */
void train_memory_log(const train_memory *t, ctrl_model *m, const char *optimizer, const size_t sliced[2]);

#endif
