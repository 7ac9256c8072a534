"""``runrow dev-db``: a local PostgreSQL for development that outlives the command.

``start`` spawns a small keeper process (``python -m runrow._devdb serve DIR``) in a
session of its own. The keeper owns an :class:`~runrow.embedded.EmbeddedPostgres` on
``DIR`` (data kept between starts), writes ``dev-db.json`` (its pid and the URL), reports
ready on a pipe, and then waits for SIGTERM or SIGINT, or for the server to die. The
launcher's guarantees hold: the server runs as an unprivileged account under root, it gets
a parent-death signal if the keeper is killed outright, and the next start shuts down any
orphan and starts again on the same data. ``stop`` signals the keeper and waits for it.

The server listens on a Unix socket in ``DIR/sock`` only, so the URL works on this machine
alone and no TCP port can clash.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path
from typing import Any

from ._errors import ConfigurationError

__all__ = ["data_home", "default_dir", "start", "status", "stop", "url_for"]

STATE = "dev-db.json"
START_TIMEOUT = 120.0
STOP_TIMEOUT = 40.0
# The keeper runs this very runrow, wherever it was imported from.
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[1])


def data_home(name: str) -> Path:
    """Where ``runrow <name>`` keeps a database between runs, for the user running it.

    ``$XDG_DATA_HOME/runrow/<name>`` (default ``~/.local/share/runrow/<name>``). Under root
    the server runs as an unprivileged account that cannot enter root's private home, and
    runrow never loosens a folder's permissions, so root's folder is
    ``/var/tmp/runrow-<name>-root`` instead (the demo's own default follows the same rule).
    """
    if os.geteuid() == 0:
        return Path(f"/var/tmp/runrow-{name}-root")  # noqa: S108 - the launcher checks it is ours and private
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "runrow" / name


def default_dir() -> Path:
    """``$RUNROW_DEV_DB_DIR`` if set, else :func:`data_home` ``("dev-db")``."""
    if env := os.environ.get("RUNROW_DEV_DB_DIR"):
        return Path(env)
    return data_home("dev-db")


def url_for(base_dir: Path, port: int = 5432) -> str:
    """The libpq URL of the dev server in ``base_dir`` (a Unix socket in ``base_dir/sock``)."""
    host = urllib.parse.quote(str(base_dir.absolute() / "sock"), safe="/")
    return f"postgresql:///postgres?host={host}&port={port}&user=postgres"


def export_line(url: str) -> str:
    return f"export DATABASE_URL={shlex.quote(url)}"


def _state(base_dir: Path) -> dict[str, Any] | None:
    """The keeper's state if the keeper it names is alive, else None."""
    try:
        state: dict[str, Any] = json.loads((base_dir / STATE).read_text())
        pid = int(state["pid"])
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if b"runrow._devdb" not in cmdline or str(base_dir.absolute()).encode() not in cmdline:
        return None  # the pid was reused by something else
    return state


def status(base_dir: Path) -> dict[str, Any]:
    """``running``, the keeper's ``pid`` (or None), the ``url`` and the ``data_dir``."""
    state = _state(base_dir)
    return {
        "running": state is not None,
        "pid": None if state is None else state["pid"],
        "url": url_for(base_dir) if state is None else state["url"],
        "data_dir": str(base_dir.absolute()),
    }


def start(base_dir: Path) -> dict[str, Any]:
    """Starts the keeper unless one is running; returns :func:`status` plus ``started``.

    Raises :class:`ConfigurationError` with the launcher's reason when the server cannot start.
    """
    base_dir = base_dir.absolute()
    if (current := status(base_dir))["running"]:
        return {**current, "started": False}
    keeper = subprocess.Popen(
        [sys.executable, "-m", "runrow._devdb", "serve", str(base_dir)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,  # a Ctrl-C or hang-up of this terminal does not reach it
        cwd="/",  # holds no folder of the caller's busy
        env={
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [_PACKAGE_ROOT, os.environ.get("PYTHONPATH")])),
        },
    )
    assert keeper.stdout is not None and keeper.stderr is not None
    try:
        line = _read_line(keeper, START_TIMEOUT)
        if not line:  # the keeper died before it could say why, or it hangs
            if keeper.poll() is None:
                keeper.kill()
            keeper.wait()
            why = keeper.stderr.read().decode(errors="replace").strip().splitlines()
            reason = why[-1] if why else f"no answer within {START_TIMEOUT:.0f}s"
            raise ConfigurationError(
                f"the dev database did not start ({reason}); see {base_dir / 'server.log'}"
            )
    finally:
        keeper.stdout.close()
        keeper.stderr.close()
    report = json.loads(line)
    if not report.get("ok"):
        keeper.wait()
        raise ConfigurationError(str(report.get("error")))
    return {**status(base_dir), "started": True}


def _read_line(proc: subprocess.Popen[bytes], timeout: float) -> str:
    import selectors

    assert proc.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        if not sel.select(timeout):
            return ""
    return proc.stdout.readline().decode(errors="replace")


def stop(base_dir: Path) -> bool:
    """Stops the keeper (and with it the server) and waits; False if none was running."""
    state = _state(base_dir.absolute())
    if state is None:
        return False
    pid = int(state["pid"])
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT
    while Path(f"/proc/{pid}").exists() and not _zombie(pid):
        if time.monotonic() > deadline:
            raise ConfigurationError(
                f"the dev database's keeper (pid {pid}) did not stop within {STOP_TIMEOUT:.0f}s"
            )
        time.sleep(0.05)
    return True


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


# -- the keeper ------------------------------------------------------------------------


def _report(outcome: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(outcome) + "\n")
    sys.stdout.flush()


def serve(base_dir: Path) -> int:
    """The keeper's body: start the server, report on stdout, wait for a signal, stop."""
    from .embedded import EmbeddedPostgres

    stopping = False

    def on_signal(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    pg = EmbeddedPostgres(base_dir, cleanup=False)
    try:
        pg.start()
    except Exception as exc:  # reported to `start`, which prints it
        _report({"ok": False, "error": str(exc)})
        return 1
    state_path = base_dir / STATE
    state_path.write_text(json.dumps({"pid": os.getpid(), "url": url_for(base_dir)}))
    _report({"ok": True})
    # Nobody reads our output any more: later writes must not fail on a closed pipe.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    os.close(devnull)
    try:
        while not stopping and pg.running:
            time.sleep(0.2)
    finally:
        with contextlib.suppress(FileNotFoundError):
            state_path.unlink()
        pg.stop()
    return 0


if __name__ == "__main__":  # pragma: no cover - the keeper process
    if len(sys.argv) != 3 or sys.argv[1] != "serve":
        raise SystemExit("usage: python -m runrow._devdb serve DIR")
    sys.exit(serve(Path(sys.argv[2])))
