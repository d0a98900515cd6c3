"""moto's server on loopback for a bench script, with this process's (and its children's) AWS calls pointed at it
and moto's test credentials: the one way the benches that emulate AWS start it."""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Iterator


@contextmanager
def local_moto() -> Iterator[str]:
    """Starts the server, points the environment at it, yields its URL; stops it at the end."""
    from moto.server import ThreadedMotoServer

    from orchestrate.launch.command import free_port

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    for k in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE"):
        os.environ.pop(k, None)
    os.environ.update({"AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ACCESS_KEY_ID": "testing",
                       "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
                       "AWS_EC2_METADATA_DISABLED": "true"})
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()
