"""Probes from inside a container sandbox: what it must not see, reach or do (issue 20).

Every probe runs in a real container sandbox of a real engine (CRIU, namespaces, cgroups,
seccomp), as the sandbox's root user would try it. Nothing here sends traffic beyond this
machine: the sandbox's network namespace has only its own loopback, and the host addresses
tried are this machine's own.
"""

from __future__ import annotations

import secrets
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import EngineProcess
from sandfork.sdk import Client, Sandbox, SandboxTimeout

pytestmark = pytest.mark.container


@pytest.fixture(scope="module")
def engine(container_engine: EngineProcess) -> EngineProcess:
    return container_engine


@pytest.fixture(scope="module")
def client(engine: EngineProcess) -> Client:
    return engine.client()


@pytest.fixture(scope="module")
def sandbox(client: Client) -> Iterator[Sandbox]:
    box = Sandbox.create(client=client)
    try:
        yield box
    finally:
        box.kill()


@pytest.fixture(scope="module")
def neighbour(client: Client) -> Iterator[Sandbox]:
    box = Sandbox.create(client=client)
    try:
        yield box
    finally:
        box.kill()


def _python(sandbox: Sandbox, code: str, timeout: float = 60) -> str:
    """Run ``code`` with the sandbox's Python; its stdout (it must exit 0)."""
    result = sandbox.exec(f"python3 - <<'EOF'\n{code}\nEOF", timeout_seconds=timeout)
    assert result.exit_code == 0, result.stderr
    return result.stdout


def test_the_sandbox_says_it_is_a_container(client: Client, sandbox: Sandbox) -> None:
    info = client.request("GET", f"/sandboxes/{sandbox.id}")
    assert info["isolation"] == "container"
    assert info["backend"] == "container"
    assert info["accelerator"] == "native"


def test_a_secret_file_of_the_host_is_unreadable(sandbox: Sandbox) -> None:
    secret = Path("/root") / f"sandfork-secret-{secrets.token_hex(4)}"
    secret.write_text("host secret")
    secret.chmod(0o600)
    try:
        probe = (
            "import glob\n"
            f"paths = ['{secret}', '/proc/1/root{secret}'] + glob.glob('/proc/*/root{secret}')\n"
            "for p in paths:\n"
            "    try:\n"
            "        print('READ', p, open(p).read())\n"
            "    except OSError as e:\n"
            "        print('refused', p, type(e).__name__)\n"
        )
        out = _python(sandbox, probe)
        assert "READ" not in out and "host secret" not in out, out
        assert out.count("refused") >= 2, out
    finally:
        secret.unlink()


def test_host_processes_are_invisible(sandbox: Sandbox, engine: EngineProcess) -> None:
    assert engine.process is not None
    host_pid = engine.process.pid
    probe = (
        "import os, signal\n"
        "pids = [int(p) for p in os.listdir('/proc') if p.isdigit()]\n"
        "names = sorted({open(f'/proc/{p}/comm').read().strip() for p in pids})\n"
        "print('PIDS', len(pids))\n"
        "print('NAMES', ','.join(names))\n"
        "try:\n"
        f"    os.kill({host_pid}, 0)\n"
        "    print('SIGNAL reached')\n"
        "except ProcessLookupError:\n"
        "    print('SIGNAL no such process')\n"
    )
    out = _python(sandbox, probe)
    names = set(out.split("NAMES ")[1].split()[0].split(","))
    assert names <= {"tini", "python", "python3", "sh"}, f"the sandbox sees {names}"
    assert "SIGNAL no such process" in out, out
    count = int(out.split("PIDS ")[1].split()[0])
    assert count < 20, f"the sandbox sees {count} processes: {out}"


class _Listener:
    """A TCP listener on one of this machine's addresses that records who connected."""

    def __init__(self, address: str) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind((address, 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            conn.close()

    def close(self) -> None:
        self.sock.close()


def _own_addresses() -> list[str]:
    """This machine's own IPv4 addresses (loopback included)."""
    import psutil

    found = {"127.0.0.1"}
    for addresses in psutil.net_if_addrs().values():
        found |= {a.address for a in addresses if a.family == socket.AF_INET}
    return sorted(found)


_SERVED = """
import time, urllib.request
while True:  # until the server started in the background answers (the exec's timeout bounds it)
    try:
        print(urllib.request.urlopen("http://127.0.0.1:8123/").status)
        break
    except OSError:
        time.sleep(0.1)
"""


def test_the_host_the_engine_and_other_sandboxes_are_unreachable(
    sandbox: Sandbox, neighbour: Sandbox, engine: EngineProcess
) -> None:
    listeners = [_Listener(address) for address in _own_addresses()]
    try:
        neighbour.exec(
            "nohup python3 -m http.server 8123 --bind 127.0.0.1 >/dev/null 2>&1 &", check=True
        )
        # The server must be listening before the probe, or "refused" would prove nothing.
        _python(neighbour, _SERVED)
        engine_port = int(engine.url.rsplit(":", 1)[1])
        targets = [(listener.sock.getsockname()[0], listener.port) for listener in listeners]
        targets += [("127.0.0.1", engine_port), ("127.0.0.1", 8123)]
        probe = (
            "import socket\n"
            f"for host, port in {targets!r}:\n"
            "    s = socket.socket()\n"
            "    s.settimeout(5)\n"
            "    try:\n"
            "        s.connect((host, port))\n"
            "        print('CONNECTED', host, port)\n"
            "    except OSError as e:\n"
            "        print('refused', host, port, e.errno)\n"
        )
        out = _python(sandbox, probe)
        assert "CONNECTED" not in out, out
        assert all(listener.accepted == 0 for listener in listeners)
        assert _python(neighbour, _SERVED).strip() == "200", "the neighbour's server works for it"
    finally:
        for listener in listeners:
            listener.close()


_SYSCALLS = {  # x86-64 numbers: what a sandbox must not be able to do
    "mount": "ctypes.CDLL(None, use_errno=True).mount(b'x', b'/mnt', b'tmpfs', 0, None)",
    "unshare": "ctypes.CDLL(None, use_errno=True).unshare(0x10000000)",
    "bpf": "ctypes.CDLL(None, use_errno=True).syscall(321, 0, 0, 0)",
    "keyctl": "ctypes.CDLL(None, use_errno=True).syscall(250, 0, 0, 0, 0, 0)",
    "init_module": "ctypes.CDLL(None, use_errno=True).syscall(175, 0, 0, b'')",
    "finit_module": "ctypes.CDLL(None, use_errno=True).syscall(313, 0, b'', 0)",
    "setns": "ctypes.CDLL(None, use_errno=True).setns(os.open('/proc/1/ns/net', 0), 0)",
}


@pytest.mark.parametrize("call", sorted(_SYSCALLS))
def test_reaching_beyond_the_sandbox_is_refused(sandbox: Sandbox, call: str) -> None:
    probe = f"import ctypes, os\nr = {_SYSCALLS[call]}\nprint('RESULT', r, ctypes.get_errno())\n"
    out = _python(sandbox, probe)
    result, errno = out.split("RESULT ")[1].split()[:2]
    assert result == "-1", f"{call} succeeded: {out}"
    assert int(errno) in (1, 9, 13, 38), f"{call}: unexpected errno {errno}"  # EPERM, EBADF..


def test_ptrace_of_a_host_process_is_refused(sandbox: Sandbox, engine: EngineProcess) -> None:
    assert engine.process is not None
    probe = (
        "import ctypes\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        f"r = libc.ptrace(16, {engine.process.pid}, 0, 0)\n"  # PTRACE_ATTACH
        "print('RESULT', r, ctypes.get_errno())\n"
    )
    out = _python(sandbox, probe)
    result, errno = out.split("RESULT ")[1].split()[:2]
    assert result == "-1" and int(errno) in (1, 3), out  # EPERM or ESRCH: never attached


def test_no_capabilities_no_new_privileges_and_a_seccomp_filter(sandbox: Sandbox) -> None:
    status = sandbox.exec("cat /proc/self/status", check=True).stdout
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    for cap in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert int(fields[cap].strip(), 16) == 0, f"{cap} = {fields[cap].strip()}"
    assert fields["NoNewPrivs"].strip() == "1"
    assert fields["Seccomp"].strip() == "2"


def test_a_sandbox_gets_the_cpu_time_of_its_cpu_count(
    client: Client, engine: EngineProcess
) -> None:
    """The kernel's own group files, read on the host: one CPU's worth of each period."""
    before = {group.relative for group in engine.container_groups()}
    box = Sandbox.create(cpu=1, client=client)
    try:
        [group] = [g for g in engine.container_groups() if g.relative not in before]
        quotas = []
        for directory in group.dirs:
            if (directory / "cpu.max").exists():
                quotas.append((directory / "cpu.max").read_text().split())
            elif (directory / "cpu.cfs_quota_us").exists():
                period = (directory / "cpu.cfs_period_us").read_text().strip()
                quotas.append([(directory / "cpu.cfs_quota_us").read_text().strip(), period])
        assert quotas == [["100000", "100000"]], quotas
    finally:
        box.kill()


def test_a_fork_bomb_in_a_small_sandbox_leaves_its_agent_alive(client: Client) -> None:
    """Its processes' kernel memory must not fill the sandbox: then the OOM killer, having
    killed the bomb's processes faster than they exit, takes the agent (which shares the
    group and, on a host that gives root no CAP_SYS_RESOURCE, cannot protect itself) and the
    sandbox is lost ("its init exited with status 137": 2 runs of 2 before tasks scaled with
    memory)."""
    box = Sandbox.create(client=client, memory_mb=512)
    try:
        with pytest.raises(SandboxTimeout):
            box.exec(
                "python3 -c 'import os\nwhile True:\n    try: os.fork()\n    except OSError: pass'",
                timeout_seconds=10,
            )
        assert box.exec("echo ok", check=True).stdout.strip() == "ok"
    finally:
        box.kill()


def test_a_fork_bomb_and_a_huge_allocation_are_stopped(
    sandbox: Sandbox, neighbour: Sandbox, engine: EngineProcess
) -> None:
    results: dict[str, object] = {}

    def bomb() -> None:
        try:
            results["bomb"] = sandbox.exec(
                "python3 -c 'import os\nwhile True:\n    try: os.fork()\n    except OSError: pass'",
                timeout_seconds=10,
            )
        except Exception as e:  # a timeout is one way it ends; anything else fails below
            results["bomb"] = e

    thread = threading.Thread(target=bomb)
    thread.start()
    try:
        # Meanwhile the engine and another sandbox answer.
        assert neighbour.create_code_context().run_code("6 * 7").text == "42"
        assert engine.client().request("GET", "/health")["status"] == "ok"
    finally:
        thread.join(120)
    stopped = results.get("bomb")
    # Stopped at its timeout, or killed before by the group's memory limit (each fork costs).
    assert isinstance(stopped, SandboxTimeout) or getattr(stopped, "exit_code", 0) > 0, stopped
    huge = sandbox.exec(
        "python3 -c 'a = bytearray(30 * 2**30); print(len(a))'", timeout_seconds=120
    )
    assert huge.exit_code != 0, "a 30 GB allocation must fail or be killed"
    touched = sandbox.exec(
        "python3 -c 'a = bytearray(8 * 2**30)\nfor i in range(0, len(a), 4096): a[i] = 1'",
        timeout_seconds=300,
    )
    assert touched.exit_code != 0, "touching more than the sandbox's memory must be stopped"
    # The sandbox itself answers again; no process of the bomb is left.
    assert sandbox.exec("echo ok", check=True).stdout.strip() == "ok"
    left = sandbox.exec("ps -e -o comm= | grep -cx python3 || true").stdout.strip()
    assert int(left or 0) == 0, f"processes of the bomb are left: {left}"
