"""kcops: a sidecar agent for LLM inference serving.

The subpackages live in top-level folders of the repository; ``kcops/agent``,
``kcops/kernels`` and the others are symlinks to them, so ``kcops.agent`` is
``agent/``, ``kcops.kernels`` is ``kernels/`` and so on, for Python, setuptools
and every tool that reads imports.

What both the agent and the worker use lives here, so that neither imports the
other: ``kcops.errors`` (typed errors and exit codes), ``kcops.auth`` (the one
token loader and the bearer check) and ``kcops.cli`` (the ``kcops`` command).
"""

__version__ = "0.1.0"
