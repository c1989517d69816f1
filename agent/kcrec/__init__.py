"""The live K(C) budget recommendation (issue 25; docs/kc.md "The live recommendation")."""

from kcops.agent.kcrec.component import ROUTE, Recommender

__all__ = ["ROUTE", "Recommender"]
