"""Run moto's S3 server with one request at a time: ``python tests/s3_serve.py HOST PORT``.

S3 applies a conditional write (``If-None-Match: *``, ``If-Match: <etag>``) atomically. moto's own
``python -m moto.server`` serves requests on threads and checks the condition and stores the object as
two steps, so two racing creators could both be told they won (seen in CI: 2 of 6). Serializing each
request's handling restores S3's guarantee: the code under test still talks real HTTP to a real server;
only the server's interleaving is made as strict as S3's. Connections stay threaded, so a slow or
paused client does not block the others beyond one request's handling.
"""
from __future__ import annotations

import signal
import sys
import threading


def serialized(app):
    lock = threading.Lock()

    def wsgi(environ, start_response):
        with lock:
            # moto builds each response whole; reading it inside the lock keeps its state change and
            # its answer one step.
            return [b"".join(app(environ, start_response))]
    return wsgi


def main(host: str, port: int) -> None:
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
    from werkzeug.serving import run_simple

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    run_simple(host, port, serialized(DomainDispatcherApplication(create_backend_app)), threaded=True,
               request_handler=MotoRequestHandler)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
