"""A FAKE server process for fault tests: it does what a real SGLang cannot be made to do on a CPU.

It prints start-up lines, then optionally replays a real crash log after N seconds, then hangs (as SGLang
does when a scheduler dies), or exits. It can spawn a child (like SGLang's scheduler/detokenizer
workers) and ignore SIGTERM, to prove the harness kills the whole tree. It never serves HTTP unless
--serve-after or --serve-when-replayed is given. It can flood its output with a real SGLang decode line
before the replay and after it (`--flood-after -1`: until it is stopped), to go past the log's bounds.

    python fake_crashing_server.py --port P [--replay LOG] [--after S] [--then hang|exit] [--child]
                                   [--ignore-term] [--serve-after S] [--bind] [--flood BYTES]
                                   [--flood-after BYTES] [--serve-when-replayed]
"""

from __future__ import annotations

import argparse
import http.server
import os
import signal
import socket
import subprocess
import sys
import threading
import time


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--replay", help="a log file whose lines are printed after --after seconds")
    parser.add_argument("--after", type=float, default=0.5)
    parser.add_argument("--then", choices=("hang", "exit"), default="hang")
    parser.add_argument("--exit-code", type=int, default=1)
    parser.add_argument("--child", action="store_true", help="spawn a sleeping child process")
    parser.add_argument("--ignore-term", action="store_true")
    parser.add_argument("--serve-after", type=float, help="answer HTTP 200 on every path after S seconds")
    parser.add_argument("--bind", action="store_true", help="bind the port first (fails if it is in use)")
    parser.add_argument("--flood", type=int, default=0, help="print about this many bytes before the replay")
    parser.add_argument("--flood-after", type=int, default=0, help="and after it (-1: until stopped)")
    parser.add_argument("--serve-when-replayed", action="store_true", help="answer HTTP 200 once replayed")
    args = parser.parse_args()

    if args.ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    print(f"[fake] starting on {args.host}:{args.port}", flush=True)
    if args.bind:
        sock = socket.socket()
        try:
            sock.bind((args.host, args.port))
        except OSError as exc:
            print(
                f"ERROR: [Errno {exc.errno}] error while attempting to bind on address "
                f"('{args.host}', {args.port}): address already in use",
                flush=True,
            )
            return 1
        sock.close()
    if args.child:
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
        print("[fake] spawned worker", flush=True)
    if args.serve_after is not None:
        threading.Timer(args.serve_after, _serve, (args.host, args.port)).start()
    time.sleep(args.after)
    _flood(args.flood)
    if args.replay:
        with open(args.replay, encoding="utf-8") as handle:
            for line in handle:
                sys.stdout.write(line)
        sys.stdout.flush()
    if args.serve_when_replayed:
        threading.Thread(target=_serve, args=(args.host, args.port), daemon=True).start()
    if args.flood_after:
        _flood(args.flood_after)
        print("[fake] flooded", flush=True)
    if args.then == "exit":
        return args.exit_code
    while True:
        time.sleep(3600)


# A real line of sglang 0.5.12's decode loop (tests/fixtures/logs/h200-sglang-0.5.12-baseline-server.log).
DECODE_LINE = (
    b"[2026-12-03 06:26:06] Decode batch, #running-req: 1, #token: 299, token usage: 0.00, cuda graph: True, "
    b"gen throughput (token/s): 364.30, #queue-req: 0\n"
)


def _flood(size: int) -> None:
    """About `size` bytes of decode lines, as fast as the pipe takes them (whole lines: at least `size`);
    a negative size, until the process is stopped."""
    block = DECODE_LINE * 512
    written = 0
    while size < 0 or written < size:
        os.write(sys.stdout.fileno(), block)
        written += len(block)


class _Ok(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args: object) -> None:
        pass


def _serve(host: str, port: int) -> None:
    http.server.ThreadingHTTPServer((host, port), _Ok).serve_forever()


if __name__ == "__main__":
    sys.exit(main())
