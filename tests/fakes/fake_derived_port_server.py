"""FAKE sglang launcher, for the derived-port rule only: it does what sglang 0.5.12's server_args does with
--port (gRPC port = port + 10000, refused above 65535, with sglang's own message, see
tests/fixtures/logs/h200-sglang-0.5.12/grpc-port-break.log), then binds the port and every derived port and
answers /health until killed. A real sglang needs a GPU; this reproduces only that rule.

    python fake_derived_port_server.py --port N [--delay S]
"""

from __future__ import annotations

import argparse
import http.server
import socket
import sys
import time

GRPC_OFFSET = 10000


SLOW = {"path": "", "seconds": 0.0}  # sglang's /health_generate answers after 1 s steps; /health at once


class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path == SLOW["path"]:
            time.sleep(SLOW["seconds"])
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: object) -> None:
        pass


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--delay", type=float, default=0.0, help="seconds of 'start-up' before listening")
    parser.add_argument("--slow-path", default="", help="a path that answers only after --slow-s seconds")
    parser.add_argument("--slow-s", type=float, default=0.0)
    args = parser.parse_args()
    SLOW.update(path=args.slow_path, seconds=args.slow_s)
    time.sleep(args.delay)
    grpc_port = args.port + GRPC_OFFSET
    if not 1 <= grpc_port <= 65535:
        print(f"ValueError: SGLANG_GRPC_PORT ({grpc_port}) must be between 1 and 65535", file=sys.stderr, flush=True)
        return 1
    grpc = socket.socket()
    grpc.bind(("127.0.0.1", grpc_port))  # raises "Address already in use" if the harness did not check it
    grpc.listen()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", args.port), Health)
    print("The server is fired up and ready to roll!", flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
