"""A fleet whose engines share a snapshot store (issue 24): a gateway in front of three
engines (container sandboxes, one each at most) whose snapshots go to one bucket of a real S3
server (SeaweedFS), each engine on a host of its own (a network namespace of the test's, with
its own address). A restore goes to the engine that has the snapshot while it has room and to
another, which fetches it from the store, when it has none; when a host is lost (its engine
SIGKILLed, its namespace removed) its sandboxes are reported dead and its durable snapshots
restore on another host with their files (checksums) and their kernel's variables. The seed's
two turns with the published PandaStack SDK and a Jupyter kernel go through the gateway too."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from jupyter_client.manager import start_new_kernel

from conftest import EngineProcess
from gateway_helpers import GatewayProcess, start_engines
from kernel_client import execute, sandbox_id, stdout
from netns import Hosts, hosts
from s3_server import SeaweedS3, new_prefix, s3_server
from sandfork.protocol import routes
from sandfork.sdk import Client, LimitExceeded, Sandbox
from store_engines import containers, s3_args, wait_for_storage
from test_snapshots import TURNS
from turns import TURN2_FINDS

__all__ = ["containers", "s3_server"]

NAMES = ["a", "b", "c"]
BLOB = os.urandom(3 << 20)


Fleet = tuple[GatewayProcess, dict[str, EngineProcess]]


@contextlib.contextmanager
def running_fleet(
    tmp_path_factory: pytest.TempPathFactory, s3: SeaweedS3, on: Hosts | None = None
) -> Iterator[Fleet]:
    """The gateway (on the hosts' shared address, or loopback) and engines a, b, c (each on
    its host, if given), one sandbox each at most, sharing a bucket of ``s3``."""
    ip = on.service if on is not None else "127.0.0.1"
    gateway = GatewayProcess(tmp_path_factory.mktemp("gateway"), NAMES, ip)
    gateway.start()
    try:
        # Short folders: a container's capture binds a socket there (at most 107 bytes).
        homes = {name: tmp_path_factory.mktemp(name) / "home" for name in NAMES}
        args = (*s3_args(s3, new_prefix()), "--EngineConfig.max_sandboxes=1")
        engines = start_engines(gateway, homes, *args, env=s3.env, on=on)
        try:
            yield gateway, engines
        finally:
            for engine in engines.values():
                engine.close()
    finally:
        gateway.stop()


@pytest.fixture
def three_hosts() -> Iterator[Hosts]:
    """Three hosts in network namespaces of the test's own."""
    with hosts(NAMES) as made:
        yield made


@pytest.fixture
def fleet(
    containers: None, three_hosts: Hosts, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Fleet]:
    """An engine on each of the three hosts; the gateway and the S3 server on an address of
    this host that the three reach."""
    s3 = SeaweedS3(tmp_path_factory.mktemp("seaweedfs"), three_hosts.service)
    s3.start()
    try:
        with running_fleet(tmp_path_factory, s3, three_hosts) as fleet:
            yield fleet
    finally:
        s3.kill()


@pytest.fixture
def loopback_fleet(
    containers: None, s3_server: SeaweedS3, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Fleet]:
    """The engines, the gateway and the S3 server on loopback, so that sandboxes reach this
    host's package sources (a namespace's host reaches nothing else)."""
    with running_fleet(tmp_path_factory, s3_server) as fleet:
        yield fleet


def owner(engines: dict[str, EngineProcess], sandbox_id: str) -> str:
    """The engine that runs the sandbox, asked directly."""
    (name,) = [n for n, e in engines.items() if e.running() and sandbox_id in e.sandbox_ids()]
    return name


def assert_restored(box: Sandbox) -> None:
    """The sandbox has the snapshot's file, byte for byte, and its kernel's variable."""
    digest = box.exec("sha256sum /root/blob", check=True).stdout.split()[0]
    assert digest == hashlib.sha256(BLOB).hexdigest()
    assert box.create_code_context().run_code("answer").text == "42"


def lose(engine: EngineProcess, on: Hosts, name: str) -> None:
    """Host ``name`` is lost: its engine SIGKILLed, its network gone, what it ran gone."""
    engine.stop(signal.SIGKILL)
    on.unplug(name)
    engine.remove_leftovers()
    shutil.rmtree(engine.ram_dir)
    engine.ram_dir.mkdir()


def fetched(engine: EngineProcess, snapshot_id: str) -> bool:
    """The engine fetched the snapshot from the store (its log says so)."""
    log = (engine.home / "engine.log").read_text(errors="replace")
    return f"fetched snapshot {snapshot_id} from the store" in log


@pytest.mark.container
def test_a_snapshot_restores_where_there_is_room_and_outlives_its_host(
    fleet: Fleet, three_hosts: Hosts
) -> None:
    gateway, engines = fleet
    client = Client(gateway.url, gateway.api_key)
    box = Sandbox.create(client=client)
    first = owner(engines, box.id)
    box.filesystem.write("/root/blob", BLOB)
    box.create_code_context().run_code("answer = 6 * 7")
    snapshot_id = box.snapshot(name="travels").id
    wait_for_storage(client, snapshot_id, "durable")

    # Its engine is full (one sandbox at most): another fetches the snapshot and runs it.
    copy = Sandbox.create(from_snapshot=snapshot_id, client=client)
    second = owner(engines, copy.id)
    assert second != first and fetched(engines[second], snapshot_id)
    assert_restored(copy)
    listed = client.request("GET", routes.SNAPSHOTS)["snapshots"]
    assert [s["id"] for s in listed].count(snapshot_id) == 1  # held twice, listed once

    # Its host is lost: its sandbox is reported dead; the snapshot restores on the third.
    lose(engines[first], three_hosts, first)

    def record() -> dict[str, Any]:
        return client.request("GET", routes.sandbox(box.id))  # type: ignore[no-any-return]

    gateway.wait_for(
        "reported the lost engine's sandbox dead", lambda: record()["status"] == "dead"
    )
    assert f"engine {first!r}" in record()["error"]
    third = Sandbox.create(from_snapshot=snapshot_id, client=client)
    last = owner(engines, third.id)
    assert last not in (first, second) and fetched(engines[last], snapshot_id)
    assert_restored(third)
    third.kill()
    copy.kill()

    # Held by the two hosts that fetched it: a rename and a delete reach both.
    client.request("PATCH", routes.snapshot(snapshot_id), json={"name": "renamed"})
    listed = client.request("GET", routes.SNAPSHOTS)["snapshots"]
    assert [s["name"] for s in listed if s["id"] == snapshot_id] == ["renamed"]
    client.request("DELETE", routes.snapshot(snapshot_id))
    for name in (second, last):
        held = engines[name].client().request("GET", routes.SNAPSHOTS)["snapshots"]
        assert snapshot_id not in [s["id"] for s in held]
    listed = client.request("GET", routes.SNAPSHOTS)["snapshots"]
    assert snapshot_id not in [s["id"] for s in listed]


@pytest.mark.container
def test_a_fork_whose_engine_is_full_starts_on_other_hosts(fleet: Fleet) -> None:
    gateway, engines = fleet
    client = Client(gateway.url, gateway.api_key)
    parent = Sandbox.create(client=client)
    try:
        home = owner(engines, parent.id)
        parent.filesystem.write("/root/blob", BLOB)
        parent.create_code_context().run_code("answer = 6 * 7")
        child = parent.fork()  # its engine is full (one sandbox at most)
        assert owner(engines, child.id) != home
        assert_restored(child)
        child.exec("echo changed > /root/blob", check=True)
        child.kill()
        children = parent.fork_tree(2)
        assert {owner(engines, c.id) for c in children} == set(NAMES) - {home}
        for copy in children:
            assert_restored(copy)
            copy.kill()
        with pytest.raises(LimitExceeded):  # reseeding needs the parent's engine
            parent.fork(reseed_python=True)
        assert_restored(parent)  # it ran on, untouched
        listed = client.request("GET", routes.SNAPSHOTS)["snapshots"]
        assert not [s for s in listed if s["name"] == f"fork of {parent.id}"]  # captures gone
    finally:
        parent.kill()


def hold(engine: EngineProcess) -> Sandbox:
    """A sandbox made on ``engine`` directly: one sandbox at most, the engine is then full."""
    return Sandbox.create(client=engine.client())


@pytest.mark.container
def test_the_seeds_two_turns_through_the_gateway_with_the_pandastack_sdk(
    loopback_fleet: Fleet,
) -> None:
    gateway, engines = loopback_fleet
    env = {**os.environ, "PANDASTACK_API": gateway.url, "PANDASTACK_API_KEY": gateway.api_key}

    def turn(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, str(TURNS), "--pandastack", *args],
            env=env, capture_output=True, text=True, timeout=900,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        return done.stdout.strip().splitlines()[-1]

    snapshot_id = turn("turn1")
    client = Client(gateway.url, gateway.api_key)
    wait_for_storage(client, snapshot_id, "durable")
    (taker,) = [n for n, e in engines.items() if (e.home / "snapshots" / snapshot_id).exists()]
    held = hold(engines[taker])  # turn 2 cannot run where turn 1 did: it runs on another host
    try:
        assert json.loads(turn("turn2", snapshot_id)) == TURN2_FINDS
        assert [n for n in NAMES if n != taker and fetched(engines[n], snapshot_id)]
    finally:
        held.kill()


@pytest.mark.container
def test_a_jupyter_kernel_whose_sandbox_lives_on_another_host(
    fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    gateway, engines = fleet
    held = hold(engines["a"])
    monkeypatch.setenv("SANDFORK_API", gateway.url)
    monkeypatch.setenv("SANDFORK_API_KEY", gateway.api_key)
    km, kc = start_new_kernel(kernel_name="sandfork", startup_timeout=120)
    try:
        assert owner(engines, sandbox_id(km)) != "a"
        execute(kc, "answer = 6 * 7")
        assert stdout(execute(kc, "print(answer)")) == "42\n"
        snapshot_id = stdout(execute(kc, "%snapshot")).strip()
        execute(kc, "answer = 0")
        # One sandbox per engine: the copy goes to the third, which fetches it once durable.
        wait_for_storage(Client(gateway.url, gateway.api_key), snapshot_id, "durable")
        first = sandbox_id(km)
        execute(kc, "%restore " + snapshot_id)  # the kernel moves onto a restored copy
        assert sandbox_id(km) != first
        assert stdout(execute(kc, "print(answer)")) == "42\n"
    finally:
        kc.stop_channels()
        km.shutdown_kernel()  # the kernel kills its sandbox as it goes
        held.kill()
