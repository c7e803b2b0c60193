"""Errors a user can fix, shared by the core and the Kedro adapters.

Their message says what is wrong and what to do; ``kedro run`` prints it alone as its last lines (the
full traceback with ``--verbose``), where any other exception keeps its traceback.
"""

from __future__ import annotations


class UserError(Exception):
    """A problem with the user's data, parameters or order of runs, not a bug: the message is the fix."""


class ConfigError(UserError, ValueError):
    """Inconsistent or missing settings; the message names the values to change."""


class DataError(UserError, ValueError):
    """Input data that is missing, damaged or not what a pinned run recorded; the message names the file."""


def user_error(error: BaseException | None) -> UserError | None:
    """The first ``UserError`` in ``error``'s chain of causes (Kedro wraps dataset and node errors)."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, UserError):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None
