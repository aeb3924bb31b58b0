"""Starts a tqkv-server on loopback for the examples (ports 0, a temp data
dir) and reads its addresses and Prometheus counters."""
import os
import re
import shutil
import subprocess
import tempfile
import threading
import urllib.request

_LINE = re.compile(r"tqkv-server (listening|data plane listening|metrics listening) on (\S+)")


class LocalServer:
    """binary: tqkv-server (default $TQKV_SERVER). backend: cpu, cuda or auto.
    Raises RuntimeError when it does not report its addresses in 60 s."""

    def __init__(self, binary=None, backend="auto", extra_args=()):
        binary = binary or os.environ.get("TQKV_SERVER", "tqkv-server")
        self.data_dir = tempfile.mkdtemp(prefix="tqkv-example-")
        self.proc = subprocess.Popen(
            [binary, "--listen", "127.0.0.1:0", "--metrics_listen", "127.0.0.1:0",
             "--data_dir", self.data_dir, "--backend", backend, *extra_args],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines, found, addrs = [], threading.Event(), {}

        def reader():
            for line in self.proc.stdout:
                self.lines.append(line.rstrip())
                m = _LINE.search(line)
                if m:
                    addrs[m.group(1)] = m.group(2)
                if len(addrs) == 3:
                    found.set()
            found.set()

        threading.Thread(target=reader, daemon=True).start()
        if not found.wait(60) or len(addrs) < 3:
            self.stop()
            raise RuntimeError("tqkv-server did not start:\n" + "\n".join(self.lines))
        self.address = addrs["listening"]
        self.data_address = addrs["data plane listening"]
        self.metrics_address = addrs["metrics listening"]

    def counter(self, name):
        """Sum of a Prometheus counter's series (all labels)."""
        with urllib.request.urlopen(f"http://{self.metrics_address}/metrics", timeout=10) as r:
            text = r.read().decode()
        total = 0.0
        for line in text.splitlines():
            if line.startswith(name) and (line[len(name)] in " {"):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
