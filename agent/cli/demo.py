"""``kcops demo``: run the loop on the embedded default and show what it sees."""

from __future__ import annotations

import asyncio
import tempfile

import click

from kcops.agent.cli.common import handle_errors


@click.command("demo", help="Start an agent for a few seconds and print its status and metrics.")
@click.option("--seconds", default=5.0, show_default=True, help="How long to run.")
@click.option("--listen", default="127.0.0.1:0", show_default=True, help="HOST:PORT (0 = free).")
@handle_errors
def demo_cmd(seconds: float, listen: str) -> None:
    import httpx

    from kcops.agent.app import Agent
    from kcops.agent.cli.status import format_status
    from kcops.agent.config import parse_config

    async def main() -> None:
        with tempfile.TemporaryDirectory(prefix="kcops-demo-") as state:
            cfg = parse_config({"agent": {"listen": listen, "state_dir": state}}, "<demo>")
            agent = Agent(cfg, token=None)
            task = asyncio.create_task(agent.run(install_signals=False))
            await asyncio.sleep(seconds)
            base = f"http://127.0.0.1:{agent.bound_port}"
            async with httpx.AsyncClient() as client:
                st = (await client.get(base + "/api/v1/status")).json()
                metrics = (await client.get(base + "/metrics")).text
            agent.request_stop()
            await task
        click.echo(format_status(st))
        click.echo("\n/metrics (excerpt):")
        for line in metrics.splitlines():
            if line.startswith(("kcops_agent_tick_seconds_count", "kcops_process_", "kcops_store")):
                click.echo("  " + line)

    asyncio.run(main())
