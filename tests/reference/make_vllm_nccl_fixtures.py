"""Writes tests/fixtures/serve/nccl_unique_id.pickle: the bytes vLLM's StatelessProcessGroup puts in
the trainer's TCPStore under "broadcast_from/0/0" when PyNcclCommunicator broadcasts its NCCL unique
id (broadcast_obj: pickle.dumps of a ctypes Structure `ncclUniqueId` with one field
`internal: c_byte * 128`, defined in vllm.distributed.device_communicators.pynccl_wrapper), with
the id's bytes set to (7 * i) mod 256 so that tests/serve/weight_trainer.c can find them and put
its own id there. vLLM is not installed in this environment (it needs CUDA): the class is declared
here under vLLM's module path, which is all pickle records of it; the bytes are then those Python's
own pickle writes (protocol 4, Python 3.11's default, as vLLM's call uses).

Also checks ctrl's TCPStore client against torch's real TCPStore when given --check-store PROBE
(PROBE: a program that joins a store at 127.0.0.1:PORT as rank 1, adds init/, reads
broadcast_from/0/0 and prints the id; see docs/serve.md "How it was checked")."""
import ctypes
import os
import pickle
import subprocess
import sys
import types

MODULE = "vllm.distributed.device_communicators.pynccl_wrapper"


def unique_id():
    parts = MODULE.split(".")
    for i in range(1, len(parts) + 1):
        sys.modules.setdefault(".".join(parts[:i]), types.ModuleType(".".join(parts[:i])))

    class ncclUniqueId(ctypes.Structure):
        _fields_ = [("internal", ctypes.c_byte * 128)]

    ncclUniqueId.__module__ = MODULE
    ncclUniqueId.__qualname__ = "ncclUniqueId"
    sys.modules[MODULE].ncclUniqueId = ncclUniqueId
    u = ncclUniqueId()
    for i in range(128):
        b = (7 * i) % 256
        u.internal[i] = b - 256 if b > 127 else b
    return u


def check_store(probe):
    import socket
    from datetime import timedelta

    from torch.distributed import TCPStore

    for libuv in (False, True):
        ls = socket.socket()
        ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        ls.bind(("127.0.0.1", 0))
        ls.listen()
        port = ls.getsockname()[1]
        p = subprocess.Popen([probe, str(port)])
        kw = dict(use_libuv=False, master_listen_fd=ls.detach()) if not libuv else dict(use_libuv=True)
        if libuv:
            ls.close()
        store = TCPStore(host_name="127.0.0.1", port=port, world_size=2, is_master=True,
                         timeout=timedelta(seconds=30), **kw)
        store.set("broadcast_from/0/0", pickle.dumps(unique_id()))
        assert p.wait() == 0, "the probe failed"
        print("torch TCPStore (libuv %s): ctrl's client joined and read the id" % libuv)


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--check-store":
        check_store(sys.argv[2])
        return
    out = os.path.join(os.path.dirname(__file__), "..", "fixtures", "serve", "nccl_unique_id.pickle")
    data = pickle.dumps(unique_id())
    with open(out, "wb") as f:
        f.write(data)
    print("wrote %s (%d bytes, pickle protocol %d)" % (out, len(data), pickle.DEFAULT_PROTOCOL))


if __name__ == "__main__":
    main()
