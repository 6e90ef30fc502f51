"""A real S3-compatible server for the tests: moto's server in its own process on 127.0.0.1 at
a free port, reached over HTTP by pyarrow exactly as a bucket elsewhere would be, stopped by its PID."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class S3Server:
    """``auth``: the server checks credentials (moto's IAM: only keys it issued are accepted), so
    the test keys are refused, as bad credentials are by a real store."""

    def __init__(self, auth: bool = False) -> None:
        self.auth, self.port, self.proc = auth, 0, None
        self.log = tempfile.TemporaryFile()  # moto logs each request: a pipe nobody reads would fill and stall it

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def env(self) -> dict[str, str]:
        """The standard variables an S3 client reads: endpoint, region and (test) credentials."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing-secret",
            "AWS_REGION": "us-east-1",
        }

    def start(self, timeout_s: float = 60.0) -> S3Server:
        env = dict(os.environ)
        if self.auth:
            env["INITIAL_NO_AUTH_ACTION_COUNT"] = "0"
        for _ in range(3):  # the port is free when picked; another process may take it before moto binds
            self.port = free_port()
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=self.log,
            )
            deadline = time.time() + timeout_s
            while time.time() < deadline and self.proc.poll() is None:
                try:
                    urllib.request.urlopen(self.endpoint + "/moto-api/data.json", timeout=2).close()
                    return self
                except (urllib.error.URLError, OSError):
                    time.sleep(0.2)
            self.stop()
        self.log.seek(0)
        raise RuntimeError(
            f"moto's S3 server did not start on 127.0.0.1: {self.log.read()[-2000:].decode(errors='replace')}"
        )

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.proc = None

    def filesystem(self):
        """A pyarrow S3 filesystem on this server that may create buckets (the product's may not)."""
        from pyarrow.fs import S3FileSystem

        env = self.env
        return S3FileSystem(
            endpoint_override=self.endpoint,
            access_key=env["AWS_ACCESS_KEY_ID"],
            secret_key=env["AWS_SECRET_ACCESS_KEY"],
            region=env["AWS_REGION"],
            allow_bucket_creation=True,
            allow_bucket_deletion=True,
        )

    def create_bucket(self, name: str) -> str:
        self.filesystem().create_dir(name)
        return name

    def keys(self, prefix: str) -> list[str]:
        """Every object under ``bucket/prefix``, as ``bucket/key``."""
        from pyarrow.fs import FileSelector, FileType

        infos = self.filesystem().get_file_info(FileSelector(prefix, recursive=True, allow_not_found=True))
        return sorted(i.path for i in infos if i.type == FileType.File)
