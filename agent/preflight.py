"""The checks ``kcops agent run`` makes before it builds anything, and ``check-config`` makes.

One function, :func:`preflight`, so the two commands cannot drift apart (they
did: check-config never loaded the rule file and passed a non-loopback listen
address without a token, both of which ``agent run`` refuses). It reads what
the configuration names and refuses, with one :class:`~kcops.errors.ConfigError`
line (exit 2), what the agent would refuse at start:

- the token (``agent.token_file`` or ``$KCOPS_TOKEN``): unreadable, empty, not
  UTF-8, or other than visible ASCII;
- a listen address beyond loopback with no token (:func:`check_exposure`);
- the rule file, with its params overrides, when the rule engine is on (off:
  remediation reads it for its ladders and goes without on a bad one, which is a
  warning here as it is a log line there);
- a collector switched ``on`` whose source is not configured.

What needs the running process (creating ``agent.state_dir``, binding the
listen port) is left to ``agent run``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kcops.agent.collectors import check_sources
from kcops.agent.control import check_exposure
from kcops.auth import load_token

if TYPE_CHECKING:
    from kcops.agent.config import Config
    from kcops.agent.rules.loader import RuleSet


@dataclass(frozen=True)
class Checked:
    """What :func:`preflight` read: the token, the rule set (None with the rule engine
    off), and warnings (things that will be refused at run time, not at start)."""

    token: str | None
    ruleset: RuleSet | None
    warnings: list[str] = field(default_factory=list)


def preflight(config: Config, token: str | None = None) -> Checked:
    """Everything ``agent run`` refuses before it starts; ConfigError (exit 2) on the first.

    ``token``: one already in hand (tests); else the configured one is loaded.
    """
    from kcops.agent.config.actions import warnings
    from kcops.agent.rules.loader import ruleset_from_config
    from kcops.agent.rules.model import RuleError

    if token is None:
        token = load_token(config.agent.token_file)
    check_exposure(config.agent.host_port()[0], token is not None)
    found = list(warnings(config.actions))
    ruleset = None
    if config.rules.enabled:
        ruleset = ruleset_from_config(config)
    else:
        try:
            ruleset_from_config(config)
        except RuleError as exc:
            found.append(f"rules are off and the rule file is bad: no ladders ({exc})")
    check_sources(config)
    return Checked(token, ruleset, found)
