"""The real-server tier's environment: SGLang 0.5.23 on the CPU, built from a lock file.

    python -m tests.real.env build     build (or find) the environment and the tiny model
    python -m tests.real.env show      print where they are, build nothing (exit 1 if absent)

The environment is a venv in a cache folder outside the clone (`$FLEETDECK_REAL_CACHE`, else
`$XDG_CACHE_HOME/fleetdeck/real-sglang`, else `~/.cache/fleetdeck/real-sglang`), named by the
sha256 of `requirements.lock` and the stand-ins: a change to either builds a new one, and a
clean clone on a machine that built it once starts at once. The local CPU build of
`torch==2.13.0` goes in first, then the lock with `--no-deps`, so nothing can pull SGLang's
CUDA requirements. Builds take a file lock, so two runs on one machine (the Makefile's early
background build and the tier itself) build once. A build is only ready once SGLang has
imported in it with the stand-ins; a half-built folder is removed and built again.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
LOCK_FILE = HERE / "requirements.lock"
STANDINS = HERE / "standins"
MODEL_SCRIPT = HERE / "tiny_model.py"
TORCH = "torch==2.13.0"
SGLANG_VERSION = "0.5.23"
READY = ".fleetdeck-ready.json"
# What the server's environment must hold for SGLang's CPU engine to run with the stand-ins.
IMPORT_CHECK = ("import sgl_kernel, torchvision, sglang, sglang.srt.entrypoints.http_server; "
                "print(sglang.__version__)")


class EnvError(RuntimeError):
    """The tier's environment cannot be built or used; the message says what and where."""


def cache_root() -> Path:
    if os.environ.get("FLEETDECK_REAL_CACHE"):
        return Path(os.environ["FLEETDECK_REAL_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "fleetdeck" / "real-sglang"


def _digest(paths: list[Path]) -> str:
    h = hashlib.sha256()
    for path in paths:
        for f in sorted(p for p in ([path] if path.is_file() else path.rglob("*"))
                        if p.is_file() and "__pycache__" not in p.parts):
            h.update(str(f.relative_to(HERE)).encode() + b"\0")
            h.update(f.read_bytes() + b"\0")
    return h.hexdigest()


def env_key() -> str:
    return _digest([LOCK_FILE, STANDINS])


def model_key() -> str:
    return _digest([MODEL_SCRIPT])


@dataclass(frozen=True)
class RealEnv:
    """A ready environment: the interpreter that runs SGLang, and the tiny model it serves."""

    venv: Path
    model: Path

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    def server_env(self) -> dict[str, str]:
        """What a server process needs on top of the caller's environment."""
        return {"SGLANG_USE_CPU_ENGINE": "1", "PYTHONPATH": str(STANDINS),
                # One torch thread pool per server: two cores, and the tier's own processes.
                "OMP_NUM_THREADS": "2", "TOKENIZERS_PARALLELISM": "false",
                "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def _ready(folder: Path, key: str) -> bool:
    try:
        return json.loads((folder / READY).read_text()).get("key") == key
    except (OSError, ValueError):
        return False


def _mark_ready(folder: Path, key: str, **facts: object) -> None:
    tmp = folder / (READY + ".tmp")
    tmp.write_text(json.dumps({"key": key, "built_at": time.time(), **facts}))
    os.replace(tmp, folder / READY)


@contextmanager
def _locked(root: Path) -> Iterator[None]:
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def _run(cmd: list[str], what: str, log: Path, env: dict[str, str] | None = None) -> str:
    with open(log, "a") as out:
        out.write(f"$ {' '.join(cmd)}\n")
        out.flush()
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=out, text=True, env=env)
        out.write(r.stdout)
    if r.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
        raise EnvError(f"real-server tier: {what} failed (exit {r.returncode}); "
                       f"log {log}:\n{tail}")
    return r.stdout


def _base_python() -> str:
    # The project venv's own base interpreter: the tier's venv must not nest inside it.
    return getattr(sys, "_base_executable", None) or sys.executable


def _build_venv(folder: Path, key: str, log: Path) -> None:
    if folder.exists():
        shutil.rmtree(folder)
    _run([_base_python(), "-m", "venv", str(folder)], "creating the venv", log)
    py = str(folder / "bin" / "python")
    pip = [py, "-m", "pip", "install", "--disable-pip-version-check", "-q"]
    _run([*pip, "-U", "pip"], "upgrading pip", log)
    _run([*pip, TORCH], f"installing {TORCH} (the local CPU build)", log)
    _run([*pip, "--no-deps", "-r", str(LOCK_FILE)], f"installing {LOCK_FILE.name}", log)
    env = {**os.environ, "SGLANG_USE_CPU_ENGINE": "1", "PYTHONPATH": str(STANDINS)}
    version = _run([py, "-c", IMPORT_CHECK], "importing SGLang with the stand-ins", log,
                   env=env).strip().splitlines()[-1]
    if version != SGLANG_VERSION:
        raise EnvError(f"real-server tier: {folder} has SGLang {version}, the tier is written "
                       f"for {SGLANG_VERSION}")
    _mark_ready(folder, key, sglang=version)


def _build_model(folder: Path, key: str, python: Path, log: Path) -> None:
    if folder.exists():
        shutil.rmtree(folder)
    # The stand-ins' torchvision guard: transformers imports torchvision too.
    _run([str(python), str(MODEL_SCRIPT), str(folder)], "writing the tiny Qwen3 model", log,
         env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(STANDINS)})
    _mark_ready(folder, key)


def find() -> RealEnv | None:
    """The ready environment, or None; builds nothing."""
    root = cache_root()
    venv, model = root / f"env-{env_key()[:16]}", root / f"model-{model_key()[:16]}"
    if _ready(venv, env_key()) and _ready(model, model_key()):
        return RealEnv(venv, model)
    return None


def build() -> RealEnv:
    """The environment, built when absent or half-built. Raises EnvError, saying why."""
    root = cache_root()
    with _locked(root):
        ekey, mkey = env_key(), model_key()
        venv, model = root / f"env-{ekey[:16]}", root / f"model-{mkey[:16]}"
        log = root / "build.log"
        if not _ready(venv, ekey):
            if not LOCK_FILE.is_file():
                raise EnvError(f"real-server tier: {LOCK_FILE} is missing")
            print(f"real-server tier: building {venv} (a few minutes; log {log})",
                  file=sys.stderr, flush=True)
            _build_venv(venv, ekey, log)
        if not _ready(model, mkey):
            _build_model(model, mkey, venv / "bin" / "python", log)
        return RealEnv(venv, model)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.real.env", description=__doc__.split(
        "\n")[0])
    ap.add_argument("what", choices=["build", "show"])
    args = ap.parse_args(argv)
    try:
        env = build() if args.what == "build" else find()
    except EnvError as e:
        print(e, file=sys.stderr)
        return 2
    if env is None:
        print(f"real-server tier: no ready environment under {cache_root()} "
              "(python -m tests.real.env build)", file=sys.stderr)
        return 1
    print(json.dumps({"python": str(env.python), "model": str(env.model)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
