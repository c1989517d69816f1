"""The query API: ``/api/v1/query`` and ``/api/v1/query_range`` over the agent's store, in
Prometheus's HTTP API shape, with the rules' evaluator, behind one gate on the event loop."""

from kcops.agent.query.component import QueryComponent, to_api

__all__ = ["QueryComponent", "to_api"]
