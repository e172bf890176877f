"""Paddock's Python client: sandboxes for agentic RL over the HTTP gateway, standard library only (Python >= 3.9)."""

from .client import ExecEvent, ExecResult, Paddock, Rollout, Sandbox
from .errors import (BackendError, BusyError, ForbiddenError, InvalidRequestError, InvalidStateError, LimitError, NoCapacityError,
                     NotFoundError, PaddockError, TimeoutError, UnavailableError)

__all__ = [
    "Paddock", "Sandbox", "Rollout", "ExecResult", "ExecEvent",
    "PaddockError", "InvalidRequestError", "NotFoundError", "InvalidStateError", "ForbiddenError", "LimitError",
    "NoCapacityError", "BusyError", "UnavailableError", "TimeoutError", "BackendError",
]
