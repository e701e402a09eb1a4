#!/usr/bin/env python3
"""Interop: TRL's reward_len, a Python function written as a TRL user writes it
(examples/rewards/reward_len.py), served over HTTP by examples/rewards/trl_reward_http.py to the
`http` reward plugin, trains GRPO exactly as the built-in `length` plugin does: the same seeded run
with either reward logs the same metrics, step for step (timings aside). Also: a function that
raises stops the run with its message. usage: check_http_reward.py BUILD_DIR (after scripts/build.sh)"""
import os
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))
from check_command_reward import ROOT, prepare, run  # noqa: E402  (the same GRPO run and metrics)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(spec, port):
    p = subprocess.Popen([sys.executable, os.path.join(ROOT, "examples/rewards/trl_reward_http.py"), spec,
                          "--port", str(port)], cwd=ROOT, stderr=subprocess.DEVNULL)
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return p
        except OSError:
            time.sleep(0.1)
    p.kill()
    raise RuntimeError("the reward server did not start")


def main():
    build = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "build")
    ctrl = [os.path.join(build, "ctrl"), "--plugin-dir", os.path.join(build, "plugins")]
    with tempfile.TemporaryDirectory() as d:
        prepare(ctrl, d)
        builtin = run(ctrl, d, "builtin", "plugin = length\ntarget_length = 20")
        port = free_port()
        server = serve("examples/rewards/reward_len.py:reward_len", port)
        try:
            http = run(ctrl, d, "http", f"plugin = http\nurl = http://127.0.0.1:{port}/reward")
        finally:
            server.kill()
        for a, b in zip(builtin, http):
            diff = {k: (a[k], b.get(k)) for k in a if a[k] != b.get(k)}
            assert not diff, f"step {a.get('step')}: the HTTP reward's run differs: {diff}"
        assert len(http) == len(builtin)
        with open(f"{d}/bad.py", "w") as f:
            f.write("def bad(completions, **kw):\n    raise ValueError('no answer column')\n")
        port = free_port()
        server = serve(f"{d}/bad.py:bad", port)
        try:
            run(ctrl, d, "bad", f"plugin = http\nurl = http://127.0.0.1:{port}/reward")
            raise AssertionError("a raising reward function did not stop the run")
        except subprocess.CalledProcessError:
            pass
        finally:
            server.kill()
        print(f"ok: {len(http)} logged steps identical with TRL's reward_len over HTTP and the built-in length "
              f"reward; a raising function stops the run")
    return 0


if __name__ == "__main__":
    sys.exit(main())
