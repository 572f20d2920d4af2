"""``Sandbox``: the SDK's handle on one sandbox (PandaStack-compatible surface)."""

from __future__ import annotations

import builtins
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sandfork.sdk.client import Client, default_client, error_for
from sandfork.sdk.errors import (
    CommandFailed,
    ReplayMismatch,
    SandboxTimeout,
    SandforkError,
)
from sandfork.sdk.explore import Candidate, ExploreResult, ScoreFn, explore_forks, promote_fork
from sandfork.sdk.filesystem import Filesystem
from sandfork.sdk.models import ExecResult, Execution


class CodeContext:
    """A code context: a real ipykernel inside the sandbox whose state persists across runs."""

    def __init__(self, sandbox: Sandbox, context_id: str, language: str = "python") -> None:
        self.sandbox = sandbox
        self.id = context_id
        self.language = language

    def run_code(self, code: str, timeout_seconds: float | None = None) -> Execution:
        """Run ``code`` and return its :class:`Execution` (results, streams, error)."""
        body: dict[str, Any] = {"code": code}
        if timeout_seconds is not None:
            body["timeout_seconds"] = timeout_seconds
        path = f"/sandboxes/{self.sandbox.id}/repl/sessions/{self.id}/run"
        data = self.sandbox._ledgered("run_code", path, body, {"context": self.id})
        return Execution.from_api(data)

    def close(self) -> None:
        """Shut an isolated context down (the default context stays for the next turn)."""
        self.sandbox.client.request(
            "DELETE", f"/sandboxes/{self.sandbox.id}/repl/sessions/{self.id}"
        )

    def __enter__(self) -> CodeContext:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class Sandbox:
    """A sandbox: a VM or a container with a guest agent and Jupyter kernels inside."""

    id: str
    template: str
    status: str
    cpu: int
    memory_mb: int
    accelerator: str = ""
    isolation: str = ""  # what separates it from the host: "vm" or "container"
    created_at: str = ""
    metadata: dict[str, str] = field(default_factory=dict)
    persistent: bool = False
    boot_ms: int | None = None
    lease_seconds: float | None = None
    client: Client = field(default_factory=default_client, repr=False, compare=False)
    _replay: dict[int, dict[str, Any]] = field(default_factory=dict, repr=False, compare=False)
    _calls: int = field(default=0, repr=False, compare=False)

    @classmethod
    def _from_api(cls, data: dict[str, Any], client: Client) -> Sandbox:
        return cls(
            id=data["id"],
            template=data["template"],
            status=data["status"],
            cpu=data["cpu"],
            memory_mb=data["memory_mb"],
            accelerator=data.get("accelerator", ""),
            isolation=data.get("isolation", ""),
            created_at=data.get("created_at", ""),
            metadata=data.get("metadata") or {},
            persistent=bool(data.get("persistent")),
            boot_ms=data.get("boot_ms"),
            lease_seconds=data.get("lease_seconds"),
            client=client,
        )

    @classmethod
    def create(
        cls,
        template: str = "code-interpreter",
        *,
        memory_mb: int | None = None,
        cpu: int | None = None,
        metadata: dict[str, str] | None = None,
        persistent: bool = False,
        from_snapshot: str | None = None,
        lease_seconds: float | None = None,
        host_access: bool = False,
        backend: str | None = None,
        client: Client | None = None,
    ) -> Sandbox:
        """Create a sandbox from ``template`` (built on first use) and wait until it answers.

        With ``from_snapshot``, the sandbox resumes that snapshot instead: its code
        contexts, their variables and imports, its files and installed packages.
        With ``lease_seconds``, the engine kills it unless :meth:`renew_lease` is called
        within that many seconds, again and again.
        ``host_access`` lets it reach the host's loopback and private networks (the engine
        must allow it); otherwise it reaches only the engine's egress proxy. ``backend``
        (``"vm"`` or ``"container"``) picks what runs it; by default the engine chooses (a VM
        where KVM works, else a container).
        """
        client = client or default_client()
        optional = {
            "from_snapshot": from_snapshot,
            "host_access": host_access or None,
            "memory_mb": memory_mb,
            "cpu": cpu,
            "metadata": metadata or None,
            "lease_seconds": lease_seconds,
            "backend": backend,
        }
        body: dict[str, Any] = {"template": template, "persistent": persistent}
        body |= {name: value for name, value in optional.items() if value is not None}
        return cls._from_api(client.request("POST", "/sandboxes", json=body), client)

    @classmethod
    def get(cls, sandbox_id: str, client: Client | None = None) -> Sandbox:
        """The sandbox with this id."""
        client = client or default_client()
        return cls._from_api(client.request("GET", f"/sandboxes/{sandbox_id}"), client)

    @classmethod
    def list(cls, client: Client | None = None) -> list[Sandbox]:
        """Every sandbox of the engine."""
        client = client or default_client()
        return [cls._from_api(d, client) for d in client.request("GET", "/sandboxes")["items"]]

    def exec(
        self,
        cmd: str,
        timeout_seconds: float | None = None,
        check: bool = False,
        *,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
    ) -> ExecResult:
        """Run a shell command and wait for it.

        :raises SandboxTimeout: the command ran past ``timeout_seconds`` and was killed.
        :raises CommandFailed: ``check`` is set and the command exited non-zero.
        """
        body = _exec_body(cmd, timeout_seconds, env, cwd)
        result = ExecResult.from_api(self._ledgered("exec", f"/sandboxes/{self.id}/exec", body))
        if check and result.exit_code != 0:
            raise CommandFailed(
                f"command exited with code {result.exit_code}: {cmd}",
                exit_code=result.exit_code,
                stdout=result.stdout,
                stderr=result.stderr,
            )
        return result

    def exec_stream(
        self,
        cmd: str,
        on_stdout: Callable[[str], None] | None = None,
        on_stderr: Callable[[str], None] | None = None,
        timeout_seconds: float | None = None,
    ) -> int:
        """Run a command, calling back with output as it arrives; return the exit code."""
        lines = self.client.lines(
            "POST",
            f"/sandboxes/{self.id}/exec/stream",
            json=_exec_body(cmd, timeout_seconds, None, None),
        )
        event = ""
        for line in lines:
            if line.startswith("event:"):
                event = line[6:].strip()
            elif line.startswith("data:"):
                data = json.loads(line[5:])
                if event == "stdout" and on_stdout:
                    on_stdout(data["chunk"])
                elif event == "stderr" and on_stderr:
                    on_stderr(data["chunk"])
                elif event == "exit":
                    return int(data["exit_code"])
                elif event == "error":
                    error = data["error"]
                    raise SandboxTimeout(error) if "timeout" in error else SandforkError(error)
        raise SandforkError("the exec stream ended without an exit code; the outcome is unknown")

    def create_code_context(self, isolated: bool = False) -> CodeContext:
        """The sandbox's default code context, or (``isolated``) a new kernel of its own."""
        data = self.client.request(
            "POST",
            f"/sandboxes/{self.id}/repl/sessions",
            json={"language": "python", "isolated": isolated},
        )
        return CodeContext(self, data["id"], data.get("language", "python"))

    @property
    def filesystem(self) -> Filesystem:
        """Read, write, list and delete files in the sandbox."""
        return Filesystem(self)

    def snapshot(self, name: str | None = None, metadata: dict[str, str] | None = None) -> str:
        """Freeze kernels, memory and disk into an immutable snapshot; return its id.

        The sandbox keeps running. ``metadata`` (string values) is kept with the snapshot.
        """
        body: dict[str, Any] = {"name": name} if name is not None else {}
        if metadata:
            body["metadata"] = metadata
        data = self.client.request("POST", f"/sandboxes/{self.id}/snapshots", json=body)
        return str(data["id"])

    def fork(
        self, *, reseed_python: bool = False, metadata: dict[str, str] | None = None
    ) -> Sandbox:
        """A copy of this running sandbox that then diverges; this one runs on.

        ``reseed_python`` reseeds ``random`` and NumPy's global generator in the copy.
        """
        body = {"reseed_python": reseed_python, "metadata": metadata or {}}
        data = self.client.request("POST", f"/sandboxes/{self.id}/fork", json=body)
        return Sandbox._from_api(data["sandbox"], self.client)

    def fork_tree(
        self, count: int, *, reseed_python: bool = False, metadata: dict[str, str] | None = None
    ) -> builtins.list[Sandbox]:
        """``count`` (1-16) copies of this sandbox from one capture."""
        body = {"count": count, "reseed_python": reseed_python, "metadata": metadata or {}}
        data = self.client.request("POST", f"/sandboxes/{self.id}/fork-tree", json=body)
        return [Sandbox._from_api(c, self.client) for c in data["children"]]

    def checkpoint(self, name: str | None = None) -> str:
        """Snapshot the sandbox and mark the point in its ledger; return the snapshot id.

        ``Sandbox.resume(sandbox_id)`` later restores the latest (or the named) checkpoint.
        """
        body = {"name": name} if name is not None else {}
        event = self.client.request("POST", f"/sandboxes/{self.id}/checkpoints", json=body)
        return str(event["snapshot_id"])

    @classmethod
    def resume(
        cls, sandbox_id: str, name: str | None = None, *, client: Client | None = None
    ) -> Sandbox:
        """A new sandbox from the latest (or named) checkpoint of ``sandbox_id``.

        Its handle answers the calls made before the checkpoint from a replay cache, in
        order and without a round trip (:class:`ReplayMismatch` if a call differs), and
        runs everything after them live.
        """
        client = client or default_client()
        body = {"name": name} if name is not None else {}
        data = client.request("POST", f"/sandboxes/{sandbox_id}/resume", json=body)
        sandbox = cls._from_api(data["sandbox"], client)
        sandbox._replay = {entry["seq"]: entry for entry in data["replay"]}
        return sandbox

    def ledger(self) -> builtins.list[dict[str, Any]]:
        """The sandbox's recorded calls and checkpoint events, in order."""
        return self.client.request("GET", f"/sandboxes/{self.id}/ledger")["events"]  # type: ignore[no-any-return]

    def _ledgered(
        self, kind: str, path: str, body: dict[str, Any], extra: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """Send an exec or run_code, or answer it from the replay cache of a resume."""
        self._calls += 1
        entry = self._replay.pop(self._calls, None)
        if entry is None:
            return self.client.request("POST", path, json=body)  # type: ignore[no-any-return]
        request = {**body, **(extra or {})}
        if entry["kind"] != kind or entry["request"] != request:
            recorded = {"kind": entry["kind"], **entry["request"]}
            raise ReplayMismatch(self._calls, recorded, {"kind": kind, **request})
        failed = entry["result"].get("failed")
        if failed is not None:  # the call failed the first time: it fails the same way
            raise error_for(failed["status"], failed["error"])
        return entry["result"]  # type: ignore[no-any-return]

    def promote(
        self, *, kill_parent: bool = True, kill_siblings: bool = False
    ) -> builtins.list[str]:
        """Make this fork child the one that goes on; see :func:`sandfork.sdk.explore.promote`."""
        return promote_fork(self, kill_parent=kill_parent, kill_siblings=kill_siblings)

    def explore(self, candidates: Sequence[Candidate], score_fn: ScoreFn) -> ExploreResult:
        """Best-of-N over forks of this sandbox; see :func:`sandfork.sdk.explore.explore`."""
        return explore_forks(self, candidates, score_fn)

    def refresh(self) -> Sandbox:
        """Reload status and fields from the engine."""
        fresh = Sandbox.get(self.id, self.client)
        self.status, self.metadata = fresh.status, fresh.metadata
        return self

    def renew_lease(self, lease_seconds: float | None = None) -> None:
        """Renew the sandbox's lease (or start one, with ``lease_seconds``): the engine kills
        the sandbox when this is not called again within the lease's period."""
        body = {} if lease_seconds is None else {"lease_seconds": lease_seconds}
        data = self.client.request("POST", f"/sandboxes/{self.id}/lease", json=body)
        self.lease_seconds = data["lease_seconds"]

    def ports(self) -> builtins.list[int]:
        """The ports a server listens on in the sandbox now."""
        listed = self.client.request("GET", f"/sandboxes/{self.id}/ports")["ports"]
        return [entry["port"] for entry in listed]

    def preview_url(self, port: int) -> str:
        """Where the server listening on ``port`` in the sandbox answers: the engine's port
        proxy, which wants the API key like every endpoint (``Authorization: Bearer``)."""
        if not 0 < port < 65536:
            raise ValueError(f"port must be 1-65535, not {port}")
        return f"{self.client.url}/v1/sandboxes/{self.id}/ports/{port}/"

    def hibernate(self) -> None:
        """Capture the sandbox and stop its VM, freeing its memory; the next call to it (or
        :meth:`wake`) resumes it from the capture, under the same id."""
        self.status = self.client.request("POST", f"/sandboxes/{self.id}/hibernate")["status"]

    def wake(self) -> None:
        """Resume a hibernated sandbox now (a running one is left as it is)."""
        self.status = self.client.request("POST", f"/sandboxes/{self.id}/wake")["status"]

    def kill(self) -> None:
        """Stop the sandbox and delete everything it owns."""
        self.client.request("DELETE", f"/sandboxes/{self.id}")

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        if not self.persistent:
            self.kill()


def _exec_body(
    cmd: str, timeout: float | None, env: dict[str, str] | None, cwd: str | None
) -> dict[str, Any]:
    body: dict[str, Any] = {"cmd": cmd}
    if timeout is not None:
        body["timeout_seconds"] = timeout
    if env:
        body["env"] = env
    if cwd:
        body["cwd"] = cwd
    return body
