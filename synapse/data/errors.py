"""The one error type of the data package."""
from __future__ import annotations


class DataError(ValueError):
    """Bad data input (missing folder, unknown data set name, bad argument).

    A ``ValueError`` subclass so that callers validating a whole configuration can catch
    every bad-value error in one place; the message names the offending value and the fix.
    """
