"""Exceptions raised by swiftspec.

Every error names what was wrong: the file, the field, the value. The C++
runtime's errors are translated into these same classes by the extension
module, so callers catch one set of exceptions whatever layer raised them.
"""


class SwiftspecError(Exception):
    """Base class of all errors swiftspec raises on purpose."""


class CheckpointError(SwiftspecError, ValueError):
    """A model file, checkpoint folder, config or manifest is missing, truncated or inconsistent."""


class InvalidRequestError(SwiftspecError, ValueError):
    """A generation request or parameter is invalid (sampling parameters, prompt length, ...)."""


class FetchError(SwiftspecError, RuntimeError):
    """Downloading or checking a reference model or data set failed."""
