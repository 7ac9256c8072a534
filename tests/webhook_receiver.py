"""A real local HTTP receiver for the webhook tests (http.server in a thread): it
verifies every request's Standard Webhooks signature with the standardwebhooks library,
and fails, hangs or answers slowly as a test asks."""

from __future__ import annotations

import random
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from standardwebhooks.webhooks import Webhook


class Receiver:
    """``fail_rate``: the share of requests answered 500; ``hang``: requests wait on
    ``release`` (up to ``hang_seconds``) before answering; ``delay``: seconds before each
    answer."""

    def __init__(self, secret: str, *, fail_rate: float = 0.0, seed: int = 7) -> None:
        self.verifier = Webhook(secret)
        self.fail_rate = fail_rate
        self.delay = 0.0
        self.hang = False
        self.hang_seconds = 60.0
        self.release = threading.Event()
        self.random = random.Random(seed)
        self.lock = threading.Lock()
        self.attempts: Counter[str] = Counter()
        self.accepted: Counter[str] = Counter()
        self.bodies: dict[str, Any] = {}
        self.bad_signatures = 0
        self.arrived = threading.Event()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                receiver.handle(self, body)

            def log_message(self, *args: object) -> None:
                return None

        class Server(ThreadingHTTPServer):
            # The service posts a claim's 32 at once; with the default listen backlog (5)
            # the rest's SYNs are dropped and retried a second later (1,000 deliveries
            # took 105 s instead of 3).
            request_queue_size = 128

        self.server = Server(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def handle(self, request: BaseHTTPRequestHandler, body: bytes) -> None:
        headers = {k.lower(): v for k, v in request.headers.items()}
        try:
            payload = self.verifier.verify(body, headers)
        except Exception:
            with self.lock:
                self.bad_signatures += 1
            request.send_response(400)
            request.end_headers()
            return
        msg_id = headers["webhook-id"]
        with self.lock:
            self.attempts[msg_id] += 1
        self.arrived.set()
        if self.hang:
            self.release.wait(self.hang_seconds)
        if self.delay:
            self.release.wait(self.delay)
        with self.lock:
            failing = self.random.random() < self.fail_rate
            if not failing:
                self.accepted[msg_id] += 1
                self.bodies[msg_id] = payload
        request.send_response(500 if failing else 204)
        request.end_headers()

    def __enter__(self) -> Receiver:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()
