/* Reader of the binary fixtures written by tests/reference/fixture_io.py: a text header of
 * "name count" lines ending with "end", then float32 arrays in header order. */
#ifndef CTRL_TEST_FIXTURE_H
#define CTRL_TEST_FIXTURE_H

typedef struct fixture fixture;

/* NULL (with a message on stderr) when the file is missing or malformed. */
fixture *fixture_load(const char *path);
/* The named array and its length, or NULL. */
const float *fixture_get(const fixture *f, const char *name, long *n);
void fixture_free(fixture *f);

#endif
