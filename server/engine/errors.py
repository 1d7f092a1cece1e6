"""The errors an engine core's admission and commands raise.

Why a module of its own: every layer above the engine names them (the gRPC servicers and the
HTTP routes map each to one status, the front ends re-raise what an engine answered), while
few of those need the request and output structs of server/engine/interface.py. Nothing has
been allocated when one is raised.
"""

from __future__ import annotations


class EngineError(Exception):
    """Base of the errors admission raises; each maps to one gRPC status in the service."""


class InvalidRequest(EngineError):
    """The request itself is wrong (INVALID_ARGUMENT)."""


class AlreadyExists(EngineError):
    """A request with this id is already in flight on the deployment (ALREADY_EXISTS, 409)."""


class Overloaded(EngineError):
    """Admission control refused the request (RESOURCE_EXHAUSTED)."""


class Unavailable(EngineError):
    """The deployment is compiling, restarting or draining (UNAVAILABLE)."""


class QueueOverflow(Unavailable):
    """vLLM's --max-num-queued-reqs refused the request: as many are unfinished (waiting and
    running) as it allows. UNAVAILABLE; HTTP 503 "Service Unavailable", as vLLM's
    QueueOverflowError, so that a router or a client retries on another instance."""


class MaxQueuedTokens(Unavailable):
    """vLLM's --max-num-queued-tokens refused the request: the prompt tokens of the requests
    not yet past their prefill reach it (a TTFT guard). UNAVAILABLE; HTTP 503, as vLLM's
    MaxQueuedTokensError."""


class Paused(Unavailable):
    """Generation is paused (vLLM's `/pause`, modes abort and wait) until it resumes: a
    retryable refusal (UNAVAILABLE; HTTP 503 ServiceUnavailableError, as vLLM's
    RetryableRequestError)."""


class EngineFaulted(Unavailable):
    """vLLM 0.34.0's EngineFaultedError: with fault tolerance, the engine faulted and awaits
    a recovery instruction (server/engine_proc/sentinel.py). UNAVAILABLE; HTTP 503, so that
    load balancers and clients retry on another instance."""


ENGINE_FAULTED = ("The engine has faulted and cannot accept new requests. Please try again "
                  "later or on a different instance.")


class CheckpointBlocked(EngineError):
    """The engine's process-checkpoint state forbids the command (vLLM 0.34.0's engine core
    raises a RuntimeError, "Cannot sleep while the checkpoint state is prepared": HTTP 500)."""


class NotPlaced(EngineError):
    """The deployment could not be placed on its device (FAILED_PRECONDITION)."""
