"""Real tqkv-server processes for the sharding tests: port 0 (or a given
port, to restart a server on its address), a data dir of its own, SIGKILL."""
import os
import re
import subprocess
import tempfile
import threading

_LISTEN = re.compile(r"tqkv-server listening on (\S+)")


class Server:
    def __init__(self, data_dir=None, port=0):
        self.data_dir = data_dir or tempfile.mkdtemp(prefix="tqkv-shard-", dir=os.environ.get("TEST_TMPDIR"))
        self.proc = subprocess.Popen(
            [os.environ["TQKV_SERVER"], "--listen", f"127.0.0.1:{port}", "--metrics_listen", "127.0.0.1:0",
             "--data_listen", "off", "--data_dir", self.data_dir, "--backend", "cpu", "--threads", "1"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.address = None
        found = threading.Event()

        def reader():
            for line in self.proc.stdout:
                m = _LISTEN.search(line)
                if m and self.address is None:
                    self.address = m.group(1)
                    found.set()
            found.set()

        threading.Thread(target=reader, daemon=True).start()
        if not found.wait(60) or self.address is None:
            self.kill()
            raise RuntimeError("tqkv-server did not report its address")

    @property
    def port(self):
        return int(self.address.rpartition(":")[2])

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
