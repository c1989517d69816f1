"""Locust load for the reference worker or any OpenAI-compatible engine.

The users live in the package (``kcops.demo.load.locustfile``) so that
``kcops demo`` and ``kcops load`` use them installed; this file is the path
Locust's own command takes:

    locust -f bench/locustfile.py --host http://127.0.0.1:8000
    make load HOST=http://127.0.0.1:8000 AGENT=http://127.0.0.1:9464
"""

from kcops.demo.load.locustfile import CompletionsUser

__all__ = ["CompletionsUser"]
