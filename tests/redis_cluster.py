"""A real Redis Cluster on 127.0.0.1: six redis-server nodes, three masters with one
replica each, built with ``redis-cli --cluster create`` (tests and bench/); with
``tls``, every port (clients, cluster bus, replication) speaks only TLS, with a test
CA made by ``openssl``."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import redis

from tests.services import free_port, need_binary, running, wait_port, wait_until


@dataclass(frozen=True)
class Tls:
    """A test CA and a server certificate for 127.0.0.1 it signed (PEM files)."""

    ca: Path
    cert: Path
    key: Path

    @classmethod
    def make(cls, folder: Path) -> Tls:
        openssl = need_binary("openssl")
        folder.mkdir(parents=True, exist_ok=True)
        ca, ca_key = folder / "ca.crt", folder / "ca.key"
        cert, key, csr = folder / "server.crt", folder / "server.key", folder / "server.csr"
        ext = folder / "san.cnf"
        ext.write_text("subjectAltName=IP:127.0.0.1\n")
        for cmd in (
            ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", ca_key, "-out", ca,
             "-subj", "/CN=kcops test CA", "-days", "2"],
            ["req", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", csr,
             "-subj", "/CN=127.0.0.1"],
            ["x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial",
             "-out", cert, "-days", "2", "-extfile", ext],
        ):  # fmt: skip
            subprocess.run([openssl, *map(str, cmd)], check=True, capture_output=True)
        return cls(ca, cert, key)


@dataclass
class Cluster:
    ports: list[int]
    procs: dict[int, subprocess.Popen] = field(default_factory=dict)
    tls: Tls | None = None

    def url(self, port: int | None = None) -> str:
        if self.tls is None:
            return f"redis://127.0.0.1:{port or self.ports[0]}/0"
        return f"rediss://127.0.0.1:{port or self.ports[0]}/0?ssl_ca_certs={self.tls.ca}"

    def node(self, port: int) -> redis.Redis:
        if self.tls is None:
            return redis.Redis(host="127.0.0.1", port=port, socket_timeout=5)
        return redis.Redis(
            host="127.0.0.1", port=port, socket_timeout=5, ssl=True, ssl_ca_certs=str(self.tls.ca)
        )

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

    def healthy(self, masters: int = 3) -> bool:
        """Every live node says cluster_state:ok and ``masters`` masters, all of them
        alive, serve slots (a killed master still counts as one until the others flag
        it failed, a node timeout or more later)."""
        for p in self.alive():
            with contextlib.closing(self.node(p)) as r:
                info = r.execute_command("CLUSTER INFO")  # parsed by redis-py
            if info.get("cluster_state") != "ok":
                return False
        alive = self.alive()
        seen = [self.masters(p) for p in alive]
        return all(len(m) == masters and set(m) <= set(alive) for m in seen)

    def wait_healthy(self, masters: int = 3, timeout_s: float = 60.0) -> None:
        wait_until(
            lambda: self.healthy(masters),
            timeout_s,
            f"the cluster healthy with {masters} masters",
            interval_s=0.1,
            retry_on=(redis.RedisError,),
        )


@contextlib.contextmanager
def redis_cluster(
    tmp: Path, node_timeout_ms: int = 1000, *, tls: bool = False, replicas: int = 1
) -> Iterator[Cluster]:
    exe = need_binary("redis-server")
    cli = need_binary("redis-cli")
    n = 3 * (1 + replicas)
    ports = [free_port() for _ in range(n)]
    buses = [free_port() for _ in range(n)]
    cluster = Cluster(ports, tls=Tls.make(tmp / "tls") if tls else None)
    cli_tls: list[str] = []
    if cluster.tls is not None:
        cli_tls = ["--tls", "--cacert", str(cluster.tls.ca)]
    with contextlib.ExitStack() as stack:
        for port, bus in zip(ports, buses, strict=True):
            d = tmp / f"node-{port}"
            d.mkdir(parents=True)
            if cluster.tls is None:
                listen = ["--port", str(port)]
            else:
                t = cluster.tls
                listen = [
                    "--port", "0", "--tls-port", str(port), "--tls-cluster", "yes",
                    "--tls-replication", "yes", "--tls-cert-file", str(t.cert),
                    "--tls-key-file", str(t.key), "--tls-ca-cert-file", str(t.ca),
                    "--tls-auth-clients", "no",
                ]  # fmt: skip
            cmd = [
                exe,
                *listen,
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
        addrs = [f"127.0.0.1:{p}" for p in ports]
        create = [cli, *cli_tls, "--cluster", "create", *addrs, "--cluster-replicas"]
        res = subprocess.run(
            [*create, str(replicas), "--cluster-yes"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if res.returncode != 0:
            raise RuntimeError(f"redis-cli --cluster create failed: {res.stdout[-1500:]}")
        cluster.wait_healthy()
        yield cluster
