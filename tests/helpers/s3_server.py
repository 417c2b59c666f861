"""A real S3 API for tests: moto's standalone server in its own process, reached by pyarrow's S3 client.

``S3Server`` starts ``python -m moto.server`` on a free loopback port (or a given host), creates
a bucket over the S3 wire protocol, and can be stopped and started again on the same port (its
objects are lost with the process, as with any in-memory store; a test that restarts it mid-run
uses ``pause``/``resume`` instead, which freeze the process with SIGSTOP/SIGCONT so the store
stays and the clients see a dead peer).

The credentials are dummies; the environment the product reads them from (``AWS_*``) is what
:meth:`S3Server.env` returns, so subprocesses started after it get the standard chain. Spark's
Python workers inherit the JVM's environment, fixed when the session started: a test that runs a
query against this server passes the same variables through ``SparkContext.environment`` (see
``tests/cp_sink/test_store_sink_s3.py``) or ``spark.executorEnv.*`` on a cluster.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

ACCESS_KEY = "cloudprofiler-test-access"
SECRET_KEY = "cloudprofiler-test-secret-do-not-print"


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class S3Server:
    """moto's S3 server as a child process (optionally under a command prefix such as ``ip netns exec``)."""

    def __init__(
        self, host: str = "127.0.0.1", port: int | None = None, prefix: list[str] | None = None
    ) -> None:
        self.host = host
        self.port = port or _free_port(host)
        self.prefix = prefix or []
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    def env(self) -> dict[str, str]:
        """The standard credential chain for this server (dummy keys, endpoint, region)."""
        return {
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_EC2_METADATA_DISABLED": "true",
        }

    def start(self, timeout: float = 30.0) -> S3Server:
        cmd = [*self.prefix, sys.executable, "-m", "moto.server", "-H", self.host, "-p", str(self.port)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"moto server exited with {self.proc.returncode}")
            try:
                with socket.create_connection((self.host, self.port), timeout=0.5):
                    return self
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"moto server not listening on {self.endpoint} after {timeout} s")

    def create_bucket(self, name: str) -> None:
        import boto3

        boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
            region_name="us-east-1",
        ).create_bucket(Bucket=name)

    def pause(self) -> None:
        """Freeze the server: connections hang, as with a store that has gone away."""
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGCONT)

    def stop(self) -> None:
        if self.proc is None:
            return
        self.resume_quietly()
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def resume_quietly(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A moto S3 server on loopback with bucket ``results``; this process's AWS_* point at it."""
    server = S3Server().start()
    try:
        for k, v in server.env().items():
            monkeypatch.setenv(k, v)
        server.create_bucket("results")
        yield server
    finally:
        server.stop()
