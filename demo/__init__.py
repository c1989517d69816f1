"""The demo: ``kcops demo`` (the worker with a real model, the agent, real load, the fault
drills) and ``kcops load`` (Locust against any OpenAI-compatible engine).

Installed with the distribution ``kcops-demo`` (``pip install ./demo``); the sidecar's
install carries none of it, and nothing in production imports it.
"""
