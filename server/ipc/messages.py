"""The messages between processes, as msgspec structs encoded with msgpack.

Why they exist: the engine core of each deployment runs in a process of its own (vLLM v1's
shape), so everything that crosses between a front end, an engine core and the supervisor is
plain data with a fixed schema. Tagged array-like structs keep each message small and its
decoding one C call.

Directions (`ipc/paths.py` says which socket carries what):
- front end → engine (`ToEngine`): `AddRequest`, `Abort`, `Ack`;
- supervisor → engine (`ToEngine`): `Shutdown`, `FrontendGone`;
- engine → front end (`ToFrontend`): `Admissions` (the answer to each AddRequest, sent at
  once), `StepOutputs` (**one per engine step per front end**: the new token ids of every
  request of that front end, the step's emulated times, and the finishes);
- supervisor → front end (`ToFrontend`): `EngineDown` (a front end drains on SIGTERM);
- engine → supervisor (`ToSupervisor`): `EngineHello` (after the core is built), and
  front end → supervisor: `FrontendHello`.

Requests are named across the boundary by `(frontend, seq)`: `seq` is the front end's own
counter, unique within it; the client's request id travels once, in `AddRequest`, for logs.
"""

from __future__ import annotations

import msgspec

from server.engine.interface import EngineRequest
from server.engine.spec_metrics import RequestSpecDecodeMetrics
from server.ipc.deployment import DeploymentInfo


# ---- front end / supervisor → engine ---------------------------------------------------------
class AddRequest(msgspec.Struct, frozen=True, array_like=True, tag="add"):
    frontend: int
    seq: int
    epoch: int  # the engine incarnation the front end addressed (a restart bumps it)
    arrival: float  # emulated seconds on the shared timeline
    max_tokens: int  # resolved by the front end's check_request
    request: EngineRequest  # prompt as token ids only


class Abort(msgspec.Struct, frozen=True, array_like=True, tag="abort"):
    """End these requests now. `reason` "stop": the front end matched a stop string."""

    frontend: int
    seqs: list[int]
    reason: str = "abort"


class Ack(msgspec.Struct, frozen=True, array_like=True, tag="ack"):
    """The front end absorbed the engine's StepOutputs up to `step` (flow control)."""

    frontend: int
    step: int


class Shutdown(msgspec.Struct, frozen=True, array_like=True, tag="shutdown"):
    pass


class FrontendGone(msgspec.Struct, frozen=True, array_like=True, tag="fe_gone"):
    """A front-end process died: abort every request it submitted."""

    frontend: int


# --- KV events (issue 13) ---
class ResetPrefixCache(msgspec.Struct, frozen=True, array_like=True, tag="reset_cache"):
    """Empty the prefix cache (vLLM's reset_prefix_cache; smg's FlushCache); `token` names
    the answer, a `CacheReset`. `reset_running`: preempt the running requests first (vLLM's
    reset_running_requests), so that their blocks do not stop the reset."""

    frontend: int
    token: int
    reset_running: bool = False
    reset_external: bool = False  # the CPU offloading tier too (vLLM's reset_connector)


# --- LoRA (issue 13) ---
class LoraOp(msgspec.Struct, frozen=True, array_like=True, tag="lora_op"):
    """Load (`kind` "load") or unload an adapter at run time; answered by one `LoraAnswer`."""

    frontend: int
    op: int  # the front end's counter
    kind: str
    name: str
    path: str = ""
    rank: int | None = None
    base_model_name: str = ""


# --- sleep mode (issue 13): answered with an `Admissions` item for `seq` ---------------------
class Sleep(msgspec.Struct, frozen=True, array_like=True, tag="sleep"):
    """vLLM's sleep(level, mode, reset_connector): 0 pauses scheduling, 1 offloads the weights
    to host memory, 2 discards them; both free the KV cache, and with `reset_connector` (vLLM
    0.34.0's query parameter; always so in 0.33.0) empty the CPU tier too. mode: abort | wait
    | keep (the in-flight ones)."""

    frontend: int
    seq: int
    level: int
    mode: str = "abort"
    reset_connector: bool = True


class WakeUp(msgspec.Struct, frozen=True, array_like=True, tag="wake"):
    """vLLM's wake_up(tags): bring back `tags` (weights, kv_cache, scheduling; empty: all)."""

    frontend: int
    seq: int
    tags: tuple[str, ...] = ()


class ReleaseKvCache(msgspec.Struct, frozen=True, array_like=True, tag="release_kv"):
    """vLLM's release_kv_cache_memory: after a completed pause, empty the prefix cache (and,
    with `reset_connector`, the CPU tier) and discard the KV cache's memory until a wake-up
    (tag kv_cache) brings it back."""

    frontend: int
    seq: int
    reset_connector: bool = True


class Profile(msgspec.Struct, frozen=True, array_like=True, tag="profile"):
    """vLLM's profile(is_start, profile_prefix, delay_iterations, max_iterations) (`POST
    /start_profile`, `/stop_profile`): answered once the session started, or once its trace
    is written (server/engine_proc/profiler.py)."""

    frontend: int
    seq: int
    start: bool
    prefix: str | None = None
    delay_iterations: int | None = None
    max_iterations: int | None = None


class WeightVersion(msgspec.Struct, frozen=True, array_like=True, tag="weight_version"):
    """vLLM's set_weight_version / get_weight_version (`POST /update_weight_version`, `GET
    /weight_info`): `version` None only asks. Answered with the version now (`message`)."""

    frontend: int
    seq: int
    version: str | None = None


class Pause(msgspec.Struct, frozen=True, array_like=True, tag="pause"):
    """vLLM's pause_generation(mode, clear_cache) for weight updates (`POST /pause`): mode
    abort | wait | keep (the in-flight ones); answered once the pause holds (mode wait: once
    the running requests finished)."""

    frontend: int
    seq: int
    mode: str = "abort"
    clear_cache: bool = True


class Resume(msgspec.Struct, frozen=True, array_like=True, tag="resume"):
    """vLLM's resume_generation (`POST /resume`): generation goes on, held requests run."""

    frontend: int
    seq: int


class Checkpoint(msgspec.Struct, frozen=True, array_like=True, tag="checkpoint"):
    """vLLM 0.34.0's process-checkpoint lifecycle (`/checkpoint/prepare|restore|status`):
    `action` prepare (drain with `mode`, then release the KV cache), restore (bring it back and
    resume) or state (ask). Answered with the engine's state, `state[:error]` in `message`."""

    frontend: int
    seq: int
    action: str  # prepare | restore | state
    mode: str = "wait"


class FaultTolerance(msgspec.Struct, frozen=True, array_like=True, tag="ft"):
    """vLLM 0.34.0's fault-tolerance instruction (`POST /v1/fault_tolerance/apply`): retry or
    scale_down, its params as JSON, the recovery round's id. Answered once applied: accepted,
    or refused with vLLM's reason (server/engine_proc/sentinel.py)."""

    frontend: int
    seq: int
    instruction: str
    params: str = "{}"
    request_id: str = ""


ToEngine = (AddRequest | Abort | Ack | Shutdown | FrontendGone | ResetPrefixCache | LoraOp
            | Sleep | WakeUp | ReleaseKvCache | Profile | WeightVersion | Pause | Resume
            | Checkpoint | FaultTolerance)


# ---- engine / supervisor → front end ---------------------------------------------------------
class Admission(msgspec.Struct, frozen=True, array_like=True):
    seq: int
    error: str = ""  # "" accepted; else the EngineError class name
    message: str = ""


class Admissions(msgspec.Struct, frozen=True, array_like=True, tag="admit"):
    deployment: int
    rank: int
    items: list[Admission]


class Finished(msgspec.Struct, frozen=True, array_like=True):
    """A request the engine ended (EOS, stop token, length)."""

    seq: int
    reason: str
    stop_token_id: int | None = None
    kv_transfer_params: dict | None = None  # P/D (issue 13): a prefill's, for its decode side
    # --per-request-spec-decode-metrics: its verification steps (server/engine/spec_metrics.py)
    spec_decode_metrics: RequestSpecDecodeMetrics | None = None


class StepOutputs(msgspec.Struct, frozen=True, array_like=True, tag="step"):
    """One engine step, for the requests of one front end.

    `seqs[i]` produced `counts[i]` tokens, concatenated in `tokens`; they appeared at
    `t_end` (emulated seconds; several tokens of one request share the interval since its
    previous tokens). `first_scheduled`: (seq, prompt tokens served from the prefix cache) of
    the requests scheduled for the first time in this step (it started at `t_start`).
    `jumped`: (seq, tokens appended by jump-forward in this step). `want_ack`: the engine is
    behind its timeline and waits for an Ack before running far ahead of this front end."""

    deployment: int
    rank: int
    epoch: int
    step: int
    t_start: float
    t_end: float
    seqs: list[int]
    counts: list[int]
    tokens: list[int]
    first_scheduled: list[tuple[int, int]]
    jumped: list[tuple[int, int]]
    finished: list[Finished]
    want_ack: bool = False
    preempted: list[int] = []  # requests preempted in this step (vllm:request_num_preemptions)
    external: list[tuple[int, int]] = []  # P/D: (seq, prompt tokens whose KV was transferred)
    weight_version: str = "default"  # vLLM's label of the weights that sampled these tokens


class EngineDown(msgspec.Struct, frozen=True, array_like=True, tag="down"):
    """The engine process of (deployment, rank) died: end its requests with `message`."""

    deployment: int
    rank: int
    epoch: int
    message: str


class CacheReset(msgspec.Struct, frozen=True, array_like=True, tag="cache_reset"):
    """The answer to a ResetPrefixCache: refused (ok False) while requests hold blocks."""

    deployment: int
    rank: int
    token: int
    ok: bool


# --- LoRA (issue 13) ---
class LoraAnswer(msgspec.Struct, frozen=True, array_like=True, tag="lora_ans"):
    """The engine's answer to a `LoraOp`: status 200, or vLLM's error status and type."""

    deployment: int
    rank: int
    op: int
    status: int
    kind: str = ""
    message: str = ""


ToFrontend = Admissions | StepOutputs | EngineDown | CacheReset | LoraAnswer


# ---- to the supervisor -----------------------------------------------------------------------
class EngineHello(msgspec.Struct, frozen=True, array_like=True, tag="engine_hello"):
    deployment: int
    rank: int
    epoch: int
    pid: int
    info: DeploymentInfo


class FrontendHello(msgspec.Struct, frozen=True, array_like=True, tag="fe_hello"):
    frontend: int
    pid: int
    port: int  # the gRPC port it listens on
    error: str = ""  # "" ready; else why it could not start (e.g. the port is taken)


ToSupervisor = EngineHello | FrontendHello

encode = msgspec.msgpack.Encoder().encode
to_engine = msgspec.msgpack.Decoder(ToEngine).decode
to_frontend = msgspec.msgpack.Decoder(ToFrontend).decode
to_supervisor = msgspec.msgpack.Decoder(ToSupervisor).decode
