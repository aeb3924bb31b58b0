"""Starts the real tqkv-server (CPU backend, port 0, temp data dir) once per
test session and hands tests a connected client.

The server binary comes from $TQKV_SERVER (the sh_test wrapper sets it from
the runfiles). It prints `tqkv-server listening on HOST:PORT` on stdout once
it serves.
"""
import os
import re
import shutil
import subprocess
import tempfile
import threading
import zlib

import numpy as np
import pytest

import tqkv

_LISTEN = re.compile(r"tqkv-server listening on (\S+)")
_DATA = re.compile(r"tqkv-server data plane listening on (\S+)")


class Server:
    def __init__(self, binary, extra_args=()):
        self.data_dir = tempfile.mkdtemp(prefix="tqkv-pytest-",
                                         dir=os.environ.get("TEST_TMPDIR"))
        self.proc = subprocess.Popen(
            [binary, "--listen", "127.0.0.1:0", "--metrics_listen", "127.0.0.1:0",
             "--data_dir", self.data_dir, "--backend", "cpu", *extra_args],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines = []
        found = threading.Event()
        self.address = None
        self.data_address = None

        def reader():
            for line in self.proc.stdout:
                self.lines.append(line.rstrip())
                d = _DATA.search(line)
                if d:
                    self.data_address = d.group(1)
                m = _LISTEN.search(line)
                if m and self.address is None:
                    self.address = m.group(1)
                # The data-plane line follows the gRPC one.
                if self.address is not None and self.data_address is not None:
                    found.set()
            found.set()  # exited

        threading.Thread(target=reader, daemon=True).start()
        if not found.wait(60) or self.address is None:
            self.stop()
            raise RuntimeError("tqkv-server did not report its address:\n" + "\n".join(self.lines))

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.data_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def server():
    binary = os.environ.get("TQKV_SERVER")
    if not binary or not os.path.exists(binary):
        pytest.fail("TQKV_SERVER must name the tqkv-server binary")
    s = Server(binary)
    yield s
    s.stop()


@pytest.fixture(scope="session")
def client(server):
    c = tqkv.Client(server.address, timeout=60)
    c.wait_ready(30)
    yield c
    c.close()


@pytest.fixture
def rng(request):
    # Deterministic per test (str hash is salted per process; crc32 is not).
    return np.random.default_rng(zlib.crc32(request.node.name.encode()))
