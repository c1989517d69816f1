"""A real Redis Cluster on 127.0.0.1: six redis-server nodes, three masters with one
replica each, built with ``redis-cli --cluster create`` (tests and bench/)."""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import redis

from tests.services import free_port, need_binary, running, wait_port

REPLICAS = ("--cluster-replicas", "1", "--cluster-yes")


@dataclass
class Cluster:
    ports: list[int]
    procs: dict[int, subprocess.Popen] = field(default_factory=dict)

    def url(self, port: int | None = None) -> str:
        return f"redis://127.0.0.1:{port or self.ports[0]}/0"

    def node(self, port: int) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=port, socket_timeout=5)

    def masters(self, via: int | None = None) -> list[int]:
        """Ports of the masters that serve slots, as node ``via`` sees them."""
        with contextlib.closing(self.node(via or self.alive()[0])) as r:
            nodes = r.execute_command("CLUSTER NODES")  # parsed by redis-py
        out = []
        for addr, node in nodes.items():
            flags = node["flags"].split(",")
            if "master" in flags and "fail" not in flags and node["slots"]:
                out.append(int(addr.rsplit(":", 1)[1]))
        return sorted(out)

    def alive(self) -> list[int]:
        return [p for p in self.ports if self.procs[p].poll() is None]

    def kill(self, port: int) -> None:
        self.procs[port].kill()
        self.procs[port].wait(timeout=10)

    def wait_healthy(self, masters: int = 3, timeout_s: float = 60.0) -> None:
        """Until every live node says cluster_state:ok and ``masters`` masters serve slots."""
        deadline = time.monotonic() + timeout_s
        last = ""
        while time.monotonic() < deadline:
            try:
                ok = True
                for p in self.alive():
                    with contextlib.closing(self.node(p)) as r:
                        info = r.execute_command("CLUSTER INFO")  # parsed by redis-py
                    ok = ok and info.get("cluster_state") == "ok"
                if ok and all(len(self.masters(p)) == masters for p in self.alive()):
                    return
                last = "state not ok yet"
            except redis.RedisError as exc:
                last = str(exc)
            time.sleep(0.1)
        raise AssertionError(f"cluster not healthy within {timeout_s}s: {last}")


@contextlib.contextmanager
def redis_cluster(tmp: Path, node_timeout_ms: int = 1000) -> Iterator[Cluster]:
    exe = need_binary("redis-server")
    cli = need_binary("redis-cli")
    ports = [free_port() for _ in range(6)]
    buses = [free_port() for _ in range(6)]
    cluster = Cluster(ports)
    with contextlib.ExitStack() as stack:
        for port, bus in zip(ports, buses, strict=True):
            d = tmp / f"node-{port}"
            d.mkdir(parents=True)
            cmd = [
                exe,
                "--port", str(port),
                "--cluster-port", str(bus),
                "--bind", "127.0.0.1",
                "--cluster-enabled", "yes",
                "--cluster-config-file", str(d / "nodes.conf"),
                "--cluster-node-timeout", str(node_timeout_ms),
                # a replica may always take over, however long its link was down
                "--cluster-replica-validity-factor", "0",
                "--save", "",
                "--appendonly", "no",
                "--dir", str(d),
            ]  # fmt: skip
            cluster.procs[port] = stack.enter_context(running(cmd, log_path=d / "redis.log"))
        for port in ports:
            try:
                wait_port(port, 15, cluster.procs[port])
            except RuntimeError as exc:
                log = (tmp / f"node-{port}" / "redis.log").read_text(errors="replace")
                raise RuntimeError(f"{exc}; redis.log ends:\n{log[-1500:]}") from exc
        res = subprocess.run(
            [cli, "--cluster", "create", *[f"127.0.0.1:{p}" for p in ports], *REPLICAS],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if res.returncode != 0:
            raise RuntimeError(f"redis-cli --cluster create failed: {res.stdout[-1500:]}")
        cluster.wait_healthy()
        yield cluster
