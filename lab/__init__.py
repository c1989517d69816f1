"""The K(C) lab: offline measurements with torch and transformers, at a desk, not in a pod.

``kc measure`` (K(C) of a model on a text), ``kc sweep`` (accuracy against the KV budget
N, per policy), ``kc kpred``, ``kc verify``, ``kc retrieve``, ``kc claim`` and ``kc report``
(tables, heatmaps, TensorBoard). Installed with the distribution ``kcops-lab``
(``pip install ./lab``); the sidecar's install carries none of it. It uses the probe
(:mod:`kcops.kernels`) and the worker's model loader; nothing in production imports it.
"""
