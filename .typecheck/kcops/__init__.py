"""kcops: a sidecar agent for LLM inference serving.

The subpackages live in top-level folders of the repository; ``kcops/agent``,
``kcops/kernels`` and the others are symlinks to them, so ``kcops.agent`` is
``agent/``, ``kcops.kernels`` is ``kernels/`` and so on, for Python, setuptools
and every tool that reads imports.
"""

__version__ = "0.1.0"
