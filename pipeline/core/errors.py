"""The failures ``curio`` reports as one line, each with its exit code (anything else is a bug: a traceback).

Exit codes: 2 = bad params or bad / missing input (fix it and rerun); 3 = the LLM server is unavailable (start
it or fix ``base_url``, then rerun: finished work is kept).
"""

from __future__ import annotations


class CurioError(Exception):
    """An expected failure; its message is one line and ``exit_code`` the code ``curio`` exits with."""

    exit_code = 2


class InputError(CurioError, FileNotFoundError):
    """A stage input is missing, corrupt or not what its manifest records; the message names what to rerun.

    Also a FileNotFoundError: code that treats a missing input as optional keeps working."""


class ServerUnavailable(CurioError):
    """Every request of a batch failed to reach the LLM server, after the backend's retries."""

    exit_code = 3
