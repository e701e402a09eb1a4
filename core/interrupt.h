/* Interruption of long work (Ctrl-C, SIGTERM): the front end that handles the signals names a
 * source once, and long loops in core (tokenizing a long text...) poll it every so often and
 * return CTRL_ERR_INTERRUPTED, so a signal acts within a second. Without a source nothing is ever
 * interrupted (the library's default, and the tests'). */
#ifndef CTRL_CORE_INTERRUPT_H
#define CTRL_CORE_INTERRUPT_H

/* `interrupted` returns nonzero once work should stop; it must be cheap and async-signal-safe to
 * read (e.g. a sig_atomic_t flag). NULL removes the source. */
void ctrl_interrupt_set_source(int (*interrupted)(void));
/* Nonzero when the source says so. */
int ctrl_interrupt_requested(void);

#endif
