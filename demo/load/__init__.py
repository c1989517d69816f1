"""Real load with Locust: the user classes (``locustfile``) and a headless runner (``run``).

Locust is in the ``load`` extra; it is run as a subprocess (it monkey-patches
the standard library with gevent on import), so nothing here imports it
except the locustfile itself.
"""
