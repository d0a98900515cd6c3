"""How the controller reaches a host: run a command (real exit status, output kept apart), copy a
file there and back. `LocalTransport` is this machine (subprocess); `SSHTransport` is a remote host
over paramiko — exec channels and SFTP — whose host key must be known beforehand.

Host keys: by default the key must match one pinned in the cluster description (or a known_hosts
file); an unknown or changed key refuses the connection (paramiko's RejectPolicy). Accepting any key
is possible only by asking for it by name (`trust_on_first_use=True`), and is then recorded.
"""

from __future__ import annotations

import base64
import shlex
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from evidence.canonical import file_sha256
from evidence.errors import UserError


class TransportError(UserError, RuntimeError):
    """A host that cannot be reached, refuses its key, or fails a copy; the message names the host."""


@dataclass
class Result:
    status: int
    stdout: str
    stderr: str
    seconds: float

    def check(self, what: str) -> "Result":
        if self.status != 0:
            raise TransportError(f"{what} exited {self.status}: {self.stderr.strip()[-500:]}")
        return self


class Transport(Protocol):
    name: str

    def run(self, command: str, *, env: dict[str, str] | None = None, timeout: float = 600) -> Result: ...
    def put(self, local: Path, remote: str) -> str: ...
    def put_all(self, pairs: list[tuple[Path, str]]) -> list[str]: ...
    def get(self, remote: str, local: Path) -> str: ...
    def close(self) -> None: ...


def _batches(paths: list[str], limit: int = 60_000) -> list[list[str]]:
    """`paths` in runs whose quoted length stays well under a command line's limit."""
    out: list[list[str]] = [[]]
    size = 0
    for p in paths:
        n = len(shlex.quote(p)) + 1
        if out[-1] and size + n > limit:
            out.append([])
            size = 0
        out[-1].append(p)
        size += n
    return out if out[0] else []


def finished(chan: Any) -> bool:
    """Whether a command's channel has all it will carry: its exit status and its end of output (EOF, or
    the channel closed). OpenSSH's sshd sends the exit status as soon as the command's process ends, with
    output it has not yet read from the process's pipe still to come (session.c, session_exit_message:
    "there could be some more data waiting in the pipe"), and only after it the EOF; so the status alone
    is not the end: a read stopped there lost the last line of a `sha256sum` under load."""
    return chan.exit_status_ready() and (chan.eof_received or chan.closed)


def _env_prefix(env: dict[str, str] | None) -> str:
    return "".join(f"export {k}={shlex.quote(v)}; " for k, v in (env or {}).items())


class LocalTransport:
    def __init__(self, name: str = "local"):
        self.name = name

    def run(self, command: str, *, env: dict[str, str] | None = None, timeout: float = 600) -> Result:
        t0 = time.perf_counter()
        p = subprocess.run(["bash", "-c", _env_prefix(env) + command], capture_output=True, text=True,
                           timeout=timeout)
        return Result(p.returncode, p.stdout, p.stderr, time.perf_counter() - t0)

    def put(self, local: Path, remote: str) -> str:
        Path(remote).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(local, remote)
        return self._verified(local, Path(remote))

    def put_all(self, pairs: list[tuple[Path, str]]) -> list[str]:
        return [self.put(local, remote) for local, remote in pairs]

    def get(self, remote: str, local: Path) -> str:
        local.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(remote, local)
        return self._verified(Path(remote), local)

    def _verified(self, src: Path, dst: Path) -> str:
        a, b = file_sha256(src), file_sha256(dst)
        if a != b:
            raise TransportError(f"{self.name}: copy of {src} reads back as {b}, not {a}")
        return a

    def close(self) -> None:
        pass


class SSHTransport:
    """One paramiko connection per host, opened lazily, reused for every command and copy."""

    def __init__(self, name: str, address: str, *, user: str, key_file: Path, host_key: str | None = None,
                 known_hosts: Path | None = None, port: int = 22, connect_timeout: float = 10,
                 trust_on_first_use: bool = False):
        if not (host_key or known_hosts or trust_on_first_use):
            raise TransportError(f"{name}: no host key to check {address} against — pin one (host_key: "
                                 "'ssh-ed25519 AAAA…') or give known_hosts; trust_on_first_use must be asked for")
        self.name, self.address, self.user, self.port = name, address, user, port
        self.key_file, self.host_key, self.known_hosts = key_file, host_key, known_hosts
        self.connect_timeout, self.trust_on_first_use = connect_timeout, trust_on_first_use
        self.accepted_key: str | None = None
        self._client = None
        self._connecting = threading.Lock()  # a supervisor's watcher and its main thread share this
        self._closed = False  # once closed, never reopened: a thread that outlived its caller finds it shut

    def _connect(self, timeout: float | None = None):
        """The live connection, opened again if it died; `timeout` bounds a new connection's TCP
        connect, banner and authentication (a short probe must not wait out `connect_timeout`)."""
        with self._connecting:
            return self._connect_locked(min(timeout or self.connect_timeout, self.connect_timeout))

    def _connect_locked(self, timeout: float):
        # start-up: paramiko takes ~0.8 s to import; only SSH clusters pay it
        import paramiko

        if self._closed:
            raise TransportError(f"{self.name}: this connection was closed")
        if self._client is not None:
            tr = self._client.get_transport()
            if tr is not None and tr.is_active():
                return self._client
            self._client.close()  # the connection died: connect again rather than reuse it
            self._client = None
        c = paramiko.SSHClient()
        if self.known_hosts:  # read only: an accepted key must never be written back into it
            c.get_host_keys().load(str(self.known_hosts))
        if self.host_key:
            kind, b64 = self.host_key.split()[:2]
            key = paramiko.PKey.from_type_string(kind, base64.b64decode(b64))
            c.get_host_keys().add(f"[{self.address}]:{self.port}" if self.port != 22 else self.address, kind, key)
        c.set_missing_host_key_policy(paramiko.AutoAddPolicy() if self.trust_on_first_use else paramiko.RejectPolicy())
        try:
            c.connect(self.address, port=self.port, username=self.user, key_filename=str(self.key_file),
                      timeout=timeout, banner_timeout=timeout, auth_timeout=timeout,
                      allow_agent=False, look_for_keys=False)
        except paramiko.BadHostKeyException as e:
            c.close()
            raise TransportError(f"{self.name} ({self.address}) presented a different host key than the one "
                                 f"pinned: {e}") from None
        except paramiko.SSHException as e:
            c.close()
            raise TransportError(f"{self.name} ({self.address}:{self.port}): {e}") from None
        except OSError as e:
            c.close()
            raise TransportError(f"{self.name} ({self.address}:{self.port}) cannot be reached: {e}") from None
        k = c.get_transport().get_remote_server_key()
        self.accepted_key = f"{k.get_name()} {k.get_base64()}"
        self._client = c
        return c

    def session(self, timeout: float | None = None) -> Any:
        """A new session channel, opened within `timeout` (connecting again if the connection died).
        Its opening is the host's own answer, sshd's confirmation over the network, whatever the
        command later run on it costs: what a liveness watcher counts as "reachable"."""
        import paramiko  # start-up: as in _connect_locked

        try:
            return self._connect(timeout).get_transport().open_session(timeout=timeout or self.connect_timeout)
        except (paramiko.SSHException, EOFError, OSError) as e:
            raise TransportError(f"{self.name} ({self.address}): cannot open a session: {e}") from None

    def execute(self, chan: Any, command: str, env: dict[str, str] | None = None) -> Any:
        """Run `command` on the open session `chan` (bash -c, `env` exported first) without waiting."""
        import paramiko  # start-up: as in _connect_locked

        try:
            chan.exec_command("bash -c " + shlex.quote(_env_prefix(env) + command))
        except (paramiko.SSHException, EOFError, OSError) as e:
            chan.close()
            raise TransportError(f"{self.name} ({self.address}): cannot start a command: {e}") from None
        return chan

    def start(self, command: str, env: dict[str, str] | None = None, open_timeout: float | None = None) -> Any:
        """Start `command` on the host and return its paramiko channel without waiting for it."""
        return self.execute(self.session(open_timeout), command, env)

    def forward(self, dest: tuple[str, int], origin: tuple[str, int], timeout: float = 5.0) -> Any:
        """A `direct-tcpip` channel to `dest` as the host itself dials it (an SSH port forward): what
        the controller uses to reach a port bound to the host's private address, without a firewall
        rule. Raises TransportError when the host cannot open it (nothing listens there, say)."""
        import paramiko  # start-up: as in _connect_locked

        try:
            return self._connect(timeout).get_transport().open_channel("direct-tcpip", dest, origin,
                                                                      timeout=timeout)
        except (paramiko.SSHException, EOFError, OSError) as e:
            raise TransportError(f"{self.name} ({self.address}): cannot forward to {dest[0]}:{dest[1]}: "
                                 f"{e}") from None

    def run(self, command: str, *, env: dict[str, str] | None = None, timeout: float = 600) -> Result:
        t0 = time.perf_counter()
        chan = self.start(command, env, open_timeout=min(timeout, self.connect_timeout))
        chan.settimeout(timeout)
        out, err = bytearray(), bytearray()
        deadline = time.monotonic() + timeout
        while True:
            if time.monotonic() > deadline:  # first: a command that never stops writing still times out
                chan.close()
                raise TransportError(f"{self.name}: '{command[:80]}' ran past {timeout:.0f} s")
            if chan.recv_ready():
                out += chan.recv(65536)
            elif chan.recv_stderr_ready():
                err += chan.recv_stderr(65536)
            elif finished(chan) and not chan.recv_ready() and not chan.recv_stderr_ready():
                break
            else:
                time.sleep(0.005)
        status = chan.recv_exit_status()
        chan.close()
        return Result(status, out.decode(errors="replace"), err.decode(errors="replace"), time.perf_counter() - t0)

    def put(self, local: Path, remote: str) -> str:
        return self.put_all([(local, remote)])[0]

    def put_all(self, pairs: list[tuple[Path, str]]) -> list[str]:
        """Files uploaded, each beside its place and renamed into it, then read back and checked: their
        folders made by one command, every file through one SFTP session, the hashes read back by one
        `sha256sum` per batch of paths (`put` is one such file). A file at a time cost three round trips
        each (an SFTP session, `mkdir`, `sha256sum`): most of staging a home of dozens of files, and more
        the farther the host."""
        if not pairs:
            return []
        for batch in _batches(sorted({str(Path(r).parent) for _, r in pairs})):
            self.run("mkdir -p -- " + " ".join(map(shlex.quote, batch))).check(f"{self.name}: mkdir")
        sftp = self._connect().open_sftp()
        try:
            for local, remote in pairs:
                sftp.put(str(local), remote + ".part")
                sftp.posix_rename(remote + ".part", remote)
        finally:
            sftp.close()
        remotes = [r for _, r in pairs]
        got: list[str] = []
        for batch in _batches(remotes):  # sha256sum answers one line per path, in the order given
            lines = self.run("sha256sum -- " + " ".join(map(shlex.quote, batch))).check(
                f"{self.name}: sha256sum").stdout.splitlines()
            if len(lines) != len(batch):
                raise TransportError(f"{self.name}: sha256sum gave {len(lines)} lines for {len(batch)} files")
            got += [line.split()[0].lstrip("\\") for line in lines]
        out = []
        for (local, remote), there in zip(pairs, got):
            want = file_sha256(local)
            if there != want:
                raise TransportError(f"{self.name}: {remote} reads back as {there}, uploaded {want}")
            out.append(want)
        return out

    def get(self, remote: str, local: Path) -> str:
        local.parent.mkdir(parents=True, exist_ok=True)
        want = self.run(f"sha256sum {shlex.quote(remote)}").check(f"{self.name}: sha256sum").stdout.split()[0]
        sftp = self._connect().open_sftp()
        try:
            sftp.get(remote, str(local))
        finally:
            sftp.close()
        if file_sha256(local) != want:
            raise TransportError(f"{self.name}: {remote} arrived as {file_sha256(local)}, the host holds {want}")
        return want

    def drop(self) -> None:
        """Close the current connection, not the transport: the next use connects afresh. For a
        connection that carries nothing any more while the host may well answer a new one — the
        controller's address changed under it (a Wi-Fi change, a VPN reconnect), a NAT forgot it, or
        its packets were dropped long enough for TCP to back off for a minute or more between tries."""
        with self._connecting:
            if self._client is not None:
                self._client.close()
                self._client = None

    def close(self) -> None:
        with self._connecting:  # not while another thread is opening a connection it would then leak
            self._closed = True
            if self._client is not None:
                self._client.close()
                self._client = None
