/* vLLM's NCCL weight-transfer engine, server side (what TRL 1.16's VLLMClient drives for weight
 * sync; docs/serve.md "NCCL weight transfer"):
 *   weight_transfer.c        the engine: /init_weight_transfer_engine, /start_weight_update,
 *                            /update_weights with a JSON update_info, /finish_weight_update
 *   weight_transfer_store.c  the rendezvous: torch's TCPStore (client side) and the pickled
 *                            ncclUniqueId rank 0 publishes there
 *   weight_transfer_nccl.c   NCCL, loaded with dlopen as vLLM's pynccl does (libnccl.so.2, or the
 *                            library CTRL_NCCL_LIBRARY names: the emulated one in tests)
 * Not part of any public API. */
#ifndef CTRL_CORE_SERVE_WEIGHT_TRANSFER_H
#define CTRL_CORE_SERVE_WEIGHT_TRANSFER_H

#include <stddef.h>
#include <stdint.h>

#include <ctrl/status.h>

/* A connection to a torch TCPStore (the trainer's, rank 0 of the group). Keys are sent as given
 * (the Python API's key "k" is "/k" on the wire). */
typedef struct serve_store serve_store;
/* Connects within timeout_s (retrying while the store is not up yet), validates and pings. */
ctrl_status serve_store_connect(const char *host, int port, double timeout_s, serve_store **out);
ctrl_status serve_store_add(serve_store *s, const char *key, int64_t delta, int64_t *value, double timeout_s);
/* Waits up to timeout_s for the key, then its value (malloc'd, at most 1 MiB). */
ctrl_status serve_store_get(serve_store *s, const char *key, double timeout_s, uint8_t **val, size_t *len);
void serve_store_close(serve_store *s);
/* The 128 bytes of the ncclUniqueId that vLLM's StatelessProcessGroup.broadcast_obj pickled (a
 * ctypes Structure: _ctypes._unpickle(ncclUniqueId, ({}, bytes))); an error when p is not that. */
ctrl_status serve_unpickle_nccl_id(const uint8_t *p, size_t n, uint8_t id[128]);

/* The NCCL functions the engine calls (NCCL 2.x's C ABI: a 128-byte unique id by value, int
 * results, 0 = ncclSuccess). */
typedef struct {
    char internal[128];
} serve_nccl_id;
typedef struct serve_nccl {
    int (*get_version)(int *version);
    int (*comm_init_rank)(void **comm, int nranks, serve_nccl_id id, int rank);
    int (*comm_abort)(void *comm);
    int (*comm_get_async_error)(void *comm, int *err);
    const char *(*get_error_string)(int result);
    const char *(*get_last_error)(void *comm); /* NCCL >= 2.13; NULL before */
    int (*broadcast)(const void *send, void *recv, size_t count, int datatype, int root, void *comm,
                     void *stream);
    int (*all_reduce)(const void *send, void *recv, size_t count, int datatype, int op, void *comm,
                      void *stream);
    char path[512]; /* the library loaded */
} serve_nccl;
enum { SERVE_NCCL_UINT8 = 1, SERVE_NCCL_FLOAT32 = 7, SERVE_NCCL_SUM = 0 };
/* NCCL, loaded once (CTRL_NCCL_LIBRARY, else libnccl.so.2 as vLLM's VLLM_NCCL_SO_PATH default);
 * NULL with the reason in the error message when it cannot be. */
const serve_nccl *serve_nccl_load(void);

#endif
