#!/usr/bin/env python3
"""Serves a TRL-style reward function, unchanged, over HTTP to ctrl's `http` reward plugin.

    python3 examples/rewards/trl_reward_http.py examples/rewards/reward_len.py:reward_len --port 8011

    [reward.len]
    plugin = http
    url = http://127.0.0.1:8011/reward

ctrl POSTs each batch as one JSON object: "prompts", "completions", "completion_ids" (lists, one
entry per completion) and the dataset row's other columns (e.g. "solution"), each a list too -- the
`command` plugin's batch (examples/rewards/trl_reward_command.py). The function is called as TRL's
GRPOTrainer calls a reward function -- reward_func(prompts=..., completions=..., completion_ids=...,
**columns) -- and its list of floats (None where the reward does not apply) is the reply's body, a
JSON list. A function that raises, or returns NaN or the wrong count, gets a 500 whose body says
why (ctrl stops the run with that message). Only the standard library is used; requests are served
one at a time per connection, each on its own thread.
usage: trl_reward_http.py FILE.py:FUNCTION | MODULE:FUNCTION [--host H] [--port P]"""
import argparse
import json
import math
import sys
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from trl_reward_command import load  # FILE.py:FUNCTION or MODULE:FUNCTION, as the command server takes it


def make_handler(func):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def reply(self, status, body):
            data = body.encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json" if status == 200 else "text/plain")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(data)
            self.close_connection = True

        def do_GET(self):  # a health check
            self.reply(200, json.dumps({"status": "ok", "reward": func.__name__}))

        def do_POST(self):
            try:
                batch = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                prompts, completions = batch.pop("prompts"), batch.pop("completions")
                ids = batch.pop("completion_ids", None)
                scores = func(prompts=prompts, completions=completions, completion_ids=ids, **batch)
                out = [None if s is None else float(s) for s in scores]
                if len(out) != len(completions):
                    raise ValueError(f"{func.__name__} returned {len(out)} scores for {len(completions)} completions")
                if any(s is not None and not math.isfinite(s) for s in out):
                    raise ValueError(f"{func.__name__} returned a non-finite score: {out}")
                self.reply(200, json.dumps(out))
            except Exception as e:  # the reason goes back to ctrl, the traceback to this terminal
                traceback.print_exc()
                self.reply(500, f"{type(e).__name__}: {e}")

        def log_message(self, fmt, *args):  # quiet: one line per batch is noise in a training run
            pass

    return Handler


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("function", help="FILE.py:FUNCTION or MODULE:FUNCTION")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8011)
    a = p.parse_args()
    server = ThreadingHTTPServer((a.host, a.port), make_handler(load(a.function)))
    print(f"trl_reward_http: serving {a.function} on http://{a.host}:{server.server_port}/", file=sys.stderr,
          flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
