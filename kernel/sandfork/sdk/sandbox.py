"""``Sandbox``: the SDK's handle on one sandbox (PandaStack-compatible surface).

Every call that talks to the engine is written once, asynchronously (``async_exec``,
``async_snapshot``…); its blocking twin (``exec``, ``snapshot``…) is made from it with
:func:`sandfork.client.blocking`, the way nbclient makes ``execute`` from ``async_execute``.
Code with an event loop of its own (the proxy kernel, the server extension) awaits the
``async_`` methods on that loop.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sandfork.client import blocking, on_caller
from sandfork.protocol import SandboxInfo, routes
from sandfork.sdk.client import Client, default_client
from sandfork.sdk.errors import CommandFailed
from sandfork.sdk.exec_stream import ExecEvents
from sandfork.sdk.explore import Candidate, ExploreResult, ScoreFn, async_explore
from sandfork.sdk.filesystem import Filesystem
from sandfork.sdk.models import ExecResult, Execution
from sandfork.sdk.replay import Replay
from sandfork.sdk.snapshots import Snapshot, snapshot_id


class CodeContext:
    """A code context: a real ipykernel inside the sandbox whose state persists across runs."""

    def __init__(self, sandbox: Sandbox, context_id: str, language: str = "python") -> None:
        self.sandbox = sandbox
        self.id = context_id
        self.language = language

    async def async_run_code(self, code: str, timeout_seconds: float | None = None) -> Execution:
        """Run ``code`` and return its :class:`Execution` (results, streams, error)."""
        body: dict[str, Any] = {"code": code}
        if timeout_seconds is not None:
            body["timeout_seconds"] = timeout_seconds
        path = routes.context(self.sandbox.id, self.id, "run")
        data = await self.sandbox._ledgered("run_code", path, body, {"context": self.id})
        return Execution.from_api(data)

    async def async_close(self) -> None:
        """Shut an isolated context down (the default context stays for the next turn)."""
        await self.sandbox.client.aio.request("DELETE", routes.context(self.sandbox.id, self.id))

    run_code = blocking(async_run_code)
    close = blocking(async_close)

    def __enter__(self) -> CodeContext:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> CodeContext:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.async_close()


@dataclass
class Sandbox(SandboxInfo):
    """A sandbox: a VM or a container with a guest agent and Jupyter kernels inside. Its
    fields are the API's (:class:`sandfork.protocol.SandboxInfo`; ``extra`` holds any the
    engine sent that this SDK does not know)."""

    client: Client = field(default_factory=default_client, repr=False, compare=False)
    _replay: Replay = field(default_factory=Replay, repr=False, compare=False)

    @classmethod
    async def async_create(
        cls,
        template: str = "code-interpreter",
        *,
        memory_mb: int | None = None,
        cpu: int | None = None,
        metadata: dict[str, str] | None = None,
        persistent: bool = False,
        from_snapshot: str | Snapshot | None = None,
        lease_seconds: float | None = None,
        host_access: bool = False,
        backend: str | None = None,
        client: Client | None = None,
    ) -> Sandbox:
        """Create a sandbox from ``template`` (built on first use) and wait until it answers.

        With ``from_snapshot`` (a :class:`Snapshot` or its id), the sandbox resumes that
        snapshot instead: its code contexts, their variables and imports, its files and
        installed packages. With ``lease_seconds``, the engine kills it unless
        :meth:`renew_lease` is called within that many seconds, again and again.
        ``host_access`` lets it reach the host's loopback and private networks (the engine
        must allow it); otherwise it reaches only the engine's egress proxy. ``backend``
        (``"vm"`` or ``"container"``) picks what runs it; by default the engine chooses (a VM
        where KVM works, else a container).
        """
        client = client or default_client()
        optional = {
            "from_snapshot": snapshot_id(from_snapshot) if from_snapshot else None,
            "host_access": host_access or None,
            "memory_mb": memory_mb,
            "cpu": cpu,
            "metadata": metadata or None,
            "lease_seconds": lease_seconds,
            "backend": backend,
        }
        body: dict[str, Any] = {"template": template, "persistent": persistent}
        body |= {name: value for name, value in optional.items() if value is not None}
        return cls.from_api(
            await client.aio.request("POST", routes.SANDBOXES, json=body), client=client
        )

    @classmethod
    async def async_get(cls, sandbox_id: str, client: Client | None = None) -> Sandbox:
        """The sandbox with this id."""
        client = client or default_client()
        return cls.from_api(
            await client.aio.request("GET", routes.sandbox(sandbox_id)), client=client
        )

    @classmethod
    async def async_list(cls, client: Client | None = None) -> builtins.list[Sandbox]:
        """Every sandbox of the engine."""
        client = client or default_client()
        listing = await client.aio.request("GET", routes.SANDBOXES)
        return [cls.from_api(d, client=client) for d in listing["items"]]

    @classmethod
    async def async_resume(
        cls, sandbox_id: str, name: str | None = None, *, client: Client | None = None
    ) -> Sandbox:
        """A new sandbox from the latest (or named) checkpoint of ``sandbox_id``.

        Its handle answers the calls made before the checkpoint from a replay cache, in
        order and without a round trip (:class:`ReplayMismatch` if a call differs), and
        runs everything after them live.
        """
        client = client or default_client()
        body = {"name": name} if name is not None else {}
        data = await client.aio.request("POST", routes.sandbox(sandbox_id, "resume"), json=body)
        return cls.from_api(data["sandbox"], client=client, _replay=Replay(data["replay"]))

    async def async_exec(
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
        data = await self._ledgered("exec", routes.sandbox(self.id, "exec"), body)
        result = ExecResult.from_api(data)
        if check and result.exit_code != 0:
            raise CommandFailed(
                f"command exited with code {result.exit_code}: {cmd}",
                exit_code=result.exit_code,
                stdout=result.stdout,
                stderr=result.stderr,
            )
        return result

    async def async_exec_stream(
        self,
        cmd: str,
        on_stdout: Callable[[str], None] | None = None,
        on_stderr: Callable[[str], None] | None = None,
        timeout_seconds: float | None = None,
    ) -> int:
        """Run a command, calling back with output as it arrives; return the exit code.

        Blocking, the callbacks run on the caller's thread and may call the blocking SDK;
        awaited, they run on the event loop and must not block it.
        """
        events = ExecEvents(on_caller(on_stdout), on_caller(on_stderr))
        await self.client.aio.fetch(
            "POST",
            routes.sandbox(self.id, "exec/stream"),
            json=_exec_body(cmd, timeout_seconds, None, None),
            streaming_callback=events.feed,
        )
        return events.outcome()

    async def async_create_code_context(self, isolated: bool = False) -> CodeContext:
        """The sandbox's default code context, or (``isolated``) a new kernel of its own."""
        data = await self.client.aio.request(
            "POST",
            routes.sandbox(self.id, "repl/sessions"),
            json={"language": "python", "isolated": isolated},
        )
        return CodeContext(self, data["id"], data.get("language", "python"))

    @property
    def filesystem(self) -> Filesystem:
        """Read, write, list and delete files in the sandbox."""
        return Filesystem(self.client, self.id)

    async def async_snapshot(
        self,
        name: str | None = None,
        metadata: dict[str, str] | None = None,
        *,
        attachments: dict[str, str] | None = None,
    ) -> Snapshot:
        """Freeze kernels, memory and disk into an immutable :class:`Snapshot`.

        The sandbox keeps running. ``metadata`` (string values) is kept with the snapshot, and
        so are ``attachments``, small text files by name (``Snapshot.attachment`` reads one).
        """
        body: dict[str, Any] = {"name": name} if name is not None else {}
        if metadata:
            body["metadata"] = metadata
        if attachments:
            body["attachments"] = attachments
        data = await self.client.aio.request(
            "POST", routes.sandbox(self.id, "snapshots"), json=body
        )
        return Snapshot.from_api(data, client=self.client)

    async def async_fork(
        self, *, reseed_python: bool = False, metadata: dict[str, str] | None = None
    ) -> Sandbox:
        """A copy of this running sandbox that then diverges; this one runs on.

        ``reseed_python`` reseeds ``random`` and NumPy's global generator in the copy.
        """
        body = {"reseed_python": reseed_python, "metadata": metadata or {}}
        data = await self.client.aio.request("POST", routes.sandbox(self.id, "fork"), json=body)
        return Sandbox.from_api(data["sandbox"], client=self.client)

    async def async_fork_tree(
        self, count: int, *, reseed_python: bool = False, metadata: dict[str, str] | None = None
    ) -> builtins.list[Sandbox]:
        """``count`` (1-16) copies of this sandbox from one capture."""
        body = {"count": count, "reseed_python": reseed_python, "metadata": metadata or {}}
        data = await self.client.aio.request(
            "POST", routes.sandbox(self.id, "fork-tree"), json=body
        )
        return [Sandbox.from_api(c, client=self.client) for c in data["children"]]

    async def async_checkpoint(self, name: str | None = None) -> str:
        """Snapshot the sandbox and mark the point in its ledger; return the snapshot id.

        ``Sandbox.resume(sandbox_id)`` later restores the latest (or the named) checkpoint.
        """
        body = {"name": name} if name is not None else {}
        path = routes.sandbox(self.id, "checkpoints")
        return str((await self.client.aio.request("POST", path, json=body))["snapshot_id"])

    async def async_ledger(self) -> builtins.list[dict[str, Any]]:
        """The sandbox's recorded calls and checkpoint events, in order."""
        return (await self.client.aio.request("GET", routes.sandbox(self.id, "ledger")))["events"]  # type: ignore[no-any-return]

    async def _ledgered(
        self, kind: str, path: str, body: dict[str, Any], extra: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """Send an exec or run_code, or answer it from the replay cache of a resume."""
        answer = self._replay.answer(kind, {**body, **(extra or {})})
        if answer is None:
            return await self.client.aio.request("POST", path, json=body)  # type: ignore[no-any-return]
        return answer

    async def async_promote(
        self, *, kill_parent: bool = True, kill_siblings: bool = False
    ) -> builtins.list[str]:
        """Make this fork child the one that goes on: its parent is killed (unless
        ``kill_parent`` is false), its siblings too with ``kill_siblings``; it loses
        ``fork_parent_id`` and gets ``promoted_from``. Returns the ids killed.

        :raises BadRequestError: this sandbox is not a fork child.
        """
        body = {"kill_parent": kill_parent, "kill_siblings": kill_siblings}
        data = await self.client.aio.request("POST", routes.sandbox(self.id, "promote"), json=body)
        self._update(data["sandbox"])
        return list(data["killed"])

    async def async_explore(
        self, candidates: Sequence[Candidate], score_fn: ScoreFn
    ) -> ExploreResult[Sandbox]:
        """Best-of-N over forks of this sandbox; see :func:`sandfork.sdk.explore.explore`."""
        return await async_explore(self, candidates, score_fn)

    async def async_refresh(self) -> Sandbox:
        """Reload every field from the engine."""
        self._update(await self.client.aio.request("GET", routes.sandbox(self.id)))
        return self

    def _update(self, data: dict[str, Any]) -> None:
        fresh = Sandbox.from_api(data, client=self.client)
        for f in self.wire_fields():
            setattr(self, f.name, getattr(fresh, f.name))
        self.extra = fresh.extra

    async def async_renew_lease(self, lease_seconds: float | None = None) -> None:
        """Renew the sandbox's lease (or start one, with ``lease_seconds``): the engine kills
        the sandbox when this is not called again within the lease's period."""
        body = {} if lease_seconds is None else {"lease_seconds": lease_seconds}
        data = await self.client.aio.request("POST", routes.sandbox(self.id, "lease"), json=body)
        self.lease_seconds = data["lease_seconds"]

    async def async_ports(self) -> builtins.list[int]:
        """The ports a server listens on in the sandbox now."""
        listed = await self.client.aio.request("GET", routes.sandbox(self.id, "ports"))
        return [entry["port"] for entry in listed["ports"]]

    def preview_url(self, port: int) -> str:
        """Where the server listening on ``port`` in the sandbox answers: the engine's port
        proxy, which wants the API key like every endpoint (``Authorization: Bearer``)."""
        if not 0 < port < 65536:
            raise ValueError(f"port must be 1-65535, not {port}")
        return self.client.url + routes.API + routes.port(self.id, port)

    async def async_hibernate(self) -> None:
        """Capture the sandbox and stop its VM, freeing its memory; the next call to it (or
        :meth:`wake`) resumes it from the capture, under the same id."""
        self._update(await self.client.aio.request("POST", routes.sandbox(self.id, "hibernate")))

    async def async_wake(self) -> None:
        """Resume a hibernated sandbox now (a running one is left as it is)."""
        self._update(await self.client.aio.request("POST", routes.sandbox(self.id, "wake")))

    async def async_kill(self) -> None:
        """Stop the sandbox and delete everything it owns."""
        await self.client.aio.request("DELETE", routes.sandbox(self.id))

    create = classmethod(blocking(async_create))
    get = classmethod(blocking(async_get))
    list = classmethod(blocking(async_list))
    resume = classmethod(blocking(async_resume))
    exec = blocking(async_exec)
    exec_stream = blocking(async_exec_stream)
    create_code_context = blocking(async_create_code_context)
    snapshot = blocking(async_snapshot)
    fork = blocking(async_fork)
    fork_tree = blocking(async_fork_tree)
    checkpoint = blocking(async_checkpoint)
    ledger = blocking(async_ledger)
    promote = blocking(async_promote)
    explore = blocking(async_explore)
    refresh = blocking(async_refresh)
    renew_lease = blocking(async_renew_lease)
    ports = blocking(async_ports)
    hibernate = blocking(async_hibernate)
    wake = blocking(async_wake)
    kill = blocking(async_kill)

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        if not self.persistent:
            self.kill()

    async def __aenter__(self) -> Sandbox:
        return self

    async def __aexit__(self, *exc: object) -> None:
        if not self.persistent:
            await self.async_kill()


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
