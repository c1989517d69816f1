"""kcops: a sidecar agent for LLM inference serving.

The subpackages live in top-level folders of the repository and are mapped
into this namespace by ``package_dir`` in ``setup.cfg``: ``kcops.agent`` is
``agent/``, ``kcops.kernels`` is ``kernels/`` and so on.
"""

__version__ = "0.1.0"
