"""Why a launcher cannot run a plan: errors the driver maps to exit codes (a light module, so a
launcher plugin that Hydra loads on every command line can raise them without the driver)."""

from __future__ import annotations


class LaunchError(RuntimeError):
    """The launcher cannot run the plan (resources it will never have, a bad address)."""


class Unreachable(LaunchError):
    """The cluster does not answer: infrastructure, not input."""
