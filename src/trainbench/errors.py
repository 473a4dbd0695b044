"""The error a user can fix. Library code raises it; only the command line turns it into
one line on stderr and exit code 2, so no library module ever exits the process."""

from __future__ import annotations


class InputError(ValueError):
    """Bad input, said in one line: what is wrong and how to fix it."""
