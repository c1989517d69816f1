"""One Markdown runbook per alert; rendered and run by `kcops runbook`."""
