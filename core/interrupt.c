/* The interruption source (interrupt.h): one function pointer for the process, read atomically
 * because encodes poll it from several threads. */
#include "interrupt.h"

#include <stdatomic.h>

typedef int (*interrupt_fn)(void);
static _Atomic(interrupt_fn) source;

void ctrl_interrupt_set_source(int (*interrupted)(void)) { atomic_store(&source, interrupted); }

int ctrl_interrupt_requested(void) {
    const interrupt_fn f = atomic_load_explicit(&source, memory_order_relaxed);
    return f && f();
}
