"""The one exception a user can reach.

Every failure caused by input (a model config, a cluster, a parallel configuration, a plan file)
raises :class:`PlanError`. Its message names the value, the rule it breaks and what to change.
Internal invariants use ``assert``. The CLI catches ``PlanError`` and prints one line.
"""


class PlanError(ValueError):
    """A user-reachable error: bad input, an impossible configuration, a model that cannot fit."""


def did_you_mean(name: str, valid) -> str:
    """A hint listing the valid names, closest first."""
    import difflib

    valid = sorted(valid)
    close = difflib.get_close_matches(name, valid, n=3, cutoff=0.5)
    hint = f" Did you mean {', '.join(close)}?" if close else ""
    return f"{hint} Valid: {', '.join(valid)}."

