/* Ascending order of floats for qsort, for the core and for plugins (a quantile, a sorted code
 * book). NaNs compare equal to everything, so callers sort finite values. */
#ifndef CTRL_FLOAT_ORDER_H
#define CTRL_FLOAT_ORDER_H

static inline int ctrl_float_ascending(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

#endif
