"""Errors of the Paddock client: one base class carrying the stable wire code, one subclass per family."""

import builtins
from typing import Any, Dict, Optional


class PaddockError(Exception):
    """An error answer of the gateway (or no answer at all). Switch on ``code``, never on the message."""

    def __init__(self, code: str, message: str, retryable: bool = False, status: Optional[int] = None,
                 retry_after: Optional[float] = None, detail: Optional[Dict[str, Any]] = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        #: Whether the same call may succeed if retried later.
        self.retryable = retryable
        #: The HTTP status (None when no answer came).
        self.status = status
        #: Seconds to wait before retrying, when the gateway said (Retry-After).
        self.retry_after = retry_after
        self.detail = detail or {}


class InvalidRequestError(PaddockError):
    """The request itself was wrong: malformed, oversize, an unknown verb, or a bad spec."""


class NotFoundError(PaddockError):
    pass


class InvalidStateError(PaddockError):
    """The verb is not allowed in the sandbox's current state (or a command-log step conflicts)."""


class ForbiddenError(PaddockError):
    """A missing or wrong API key, or an operation that would leave the sandbox."""


class LimitError(PaddockError):
    """A sandbox limit (disk, memory, processes, output) refused the operation."""


class NoCapacityError(PaddockError):
    pass


class BusyError(PaddockError):
    """Too many streams, or a full FnCall queue: retry after ``retry_after`` seconds."""


class UnavailableError(PaddockError):
    """The gateway, or the Paddock behind it, cannot be reached."""


class TimeoutError(PaddockError, builtins.TimeoutError):  # noqa: A001 - paddock.TimeoutError, also a builtin TimeoutError
    pass


class BackendError(PaddockError):
    pass


_CLASSES = {
    "INVALID_REQUEST": InvalidRequestError,
    "UNKNOWN_VERB": InvalidRequestError,
    "PAYLOAD_TOO_LARGE": InvalidRequestError,
    "INVALID_SPEC": InvalidRequestError,
    "CANCELLED": InvalidRequestError,
    "NOT_FOUND": NotFoundError,
    "INVALID_STATE": InvalidStateError,
    "ALREADY_EXISTS": InvalidStateError,
    "REPLAY_MISMATCH": InvalidStateError,
    "UNKNOWN_OUTCOME": InvalidStateError,
    "STEP_CONFLICT": InvalidStateError,
    "STEP_OUT_OF_ORDER": InvalidStateError,
    "FORBIDDEN": ForbiddenError,
    "DISK_LIMIT": LimitError,
    "MEMORY_LIMIT": LimitError,
    "PIDS_LIMIT": LimitError,
    "OUTPUT_LIMIT": LimitError,
    "NO_CAPACITY": NoCapacityError,
    "BUSY": BusyError,
    "UNAVAILABLE": UnavailableError,
    "TIMEOUT": TimeoutError,
    "BACKEND_FAILED": BackendError,
}


def error_from(body: Dict[str, Any], status: Optional[int] = None, retry_after: Optional[float] = None) -> PaddockError:
    code = str(body.get("code", "INTERNAL"))
    cls = _CLASSES.get(code, PaddockError)
    return cls(code, str(body.get("message", "")), bool(body.get("retryable", False)), status, retry_after, body.get("detail"))
