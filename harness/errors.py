"""One error type for the harness: its message names the input at fault and the fix; the CLI prints it as
one line and exits non-zero."""
from __future__ import annotations


class HarnessError(Exception):
    """A problem the user can act on (bad input, server that died, missing tool)."""


class ServerDied(HarnessError):
    """The server process exited or never became ready; the message carries its log tail."""
