"""vLLM's NIXL connector between a prefill pod and a decode pod, emulated on the engine core's
loop: the side channel is real (ZeroMQ over TCP on loopback), the KV bytes are not moved but
their transfer is charged on the decode side's emulated timeline by `devices.transfer`.

Why it exists: llm-d's P/D (its routing sidecar, `connector_nixlv2.go`) sends a request with
`kv_transfer_params.do_remote_decode` to a prefill pod, takes the `kv_transfer_params` of its
response and sends the request on to a decode pod, which pulls the prompt's KV from the
prefill pod. Routers and sidecars are tested against exactly that exchange, so both halves
are kept as vLLM's connector has them (vllm/distributed/kv_transfer/kv_connector/v1/
nixl_connector.py @ 002a105; docs/PD.md):

- prefill (producer): a request with `do_remote_decode` that ends length-capped keeps its
  blocks (`Scheduler.hold`) for `VLLM_NIXL_ABORT_REQUEST_TIMEOUT` (480 s by default, emulated
  time) and returns `do_remote_prefill, remote_engine_id, remote_block_ids,
  remote_request_id, remote_host, remote_port, tp_size`; a request that stops (EOS) or is
  aborted keeps nothing. The side channel (a ROUTER on host:port + data-parallel rank, as
  vLLM's `_nixl_handshake_listener`) answers the handshake (`get_meta_msg`), the decode
  side's read and its completion notification (`"<remote_request_id>:<tp_size>"`), which
  frees the blocks; expired holds are freed with vLLM's warning.
- decode (consumer): a request with `do_remote_prefill` and the remote fields is held back
  from the scheduler; the connector handshakes with the prefill pod once per remote engine
  and asks it for the blocks. On its answer the request joins the scheduler expecting the
  prompt's KV (all but the last prompt token, which vLLM recomputes); the scheduler starts
  the pull when it admits the request (`server/engine/kv_pulls.py`), and the connector times
  it — the KV bytes over the link between the two deployments' chips, after any pull already
  on that link. When it lands (or the request ends first) the prefill pod is notified. A
  prefill pod that no longer holds the blocks (expired, freed, restarted) makes the load
  fail, and `kv_load_failure_policy` decides as in vLLM: "recompute" (default) prefills
  locally, "fail" ends the request with finish reason error.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec
import zmq

from devices import catalog
from devices.transfer import kv_link, transfer_seconds
from server.engine.kv_pulls import RemotePulls
from server.engine.kv_transfer import KvTransferConfig
from server.engine.scheduler import Scheduler
from server.ipc.deployment import DeploymentInfo

log = logging.getLogger("doppelchip.engine")
GET_META_MSG = "get_meta_msg"
_enc, _dec = msgspec.msgpack.Encoder(), msgspec.msgpack.Decoder()


@dataclass(eq=False)
class _Transfer:
    live: Any  # the engine loop's record of the request
    key: str  # the scheduler's id of the request
    params: dict[str, Any]
    num_tokens: int  # prompt tokens whose KV the prefill pod holds (then: the pull's)
    answered: bool = False  # the prefill pod answered the read
    failed: bool = False
    link: Any = None  # devices.transfer's link between the pods, and its lanes
    lanes: int = 1
    seconds: float = 0.0  # on the link (queueing behind earlier transfers excluded)
    nbytes: float = 0.0


class NixlConnector:
    def __init__(self, config: KvTransferConfig, info: DeploymentInfo, rank: int,
                 scheduler: Scheduler, ctx: zmq.Context, poller: zmq.Poller,
                 now: Callable[[], float]) -> None:
        self.config, self.info, self.rank, self.sched = config, info, rank, scheduler
        self.ctx, self.poller, self.now = ctx, poller, now
        self.engine_id = config.engine_id
        # vLLM: the port + data_parallel_index, the rank in the group (a pod of ranks S.. too)
        self.port = config.side_channel_port + info.dp_rank
        self.listener = ctx.socket(zmq.ROUTER)
        self.listener.setsockopt(zmq.LINGER, 0)
        self.listener.bind(f"tcp://{config.side_channel_host}:{self.port}")
        poller.register(self.listener, zmq.POLLIN)
        self.holds: dict[str, float] = {}  # producer: request key -> emulated expiry
        self.peers: dict[tuple[str, int], zmq.Socket] = {}
        self.meta: dict[str, dict[str, Any]] = {}  # remote engine id -> its handshake
        self.pending: dict[str, _Transfer] = {}  # consumer: reads not answered or not taken
        self.pulling: dict[str, _Transfer] = {}  # consumer: in the scheduler, pull expected
        #                                          or under way (RemotePulls)
        self.pulls = RemotePulls(self._timing, self._ended)
        scheduler.attach_pulls(self.pulls)
        self.link_free = 0.0  # emulated time the inbound link is next free
        self.bytes = self.seconds = 0.0
        self.transfers = self.failures = 0
        # vLLM's NixlKVConnectorStats: one record per worker (TP rank × PP stage) and transfer,
        # (seconds, bytes, descriptors), drained by the stats; the P side's expiry counts
        self.xfers: list[tuple[float, float, int]] = []
        self.expired = self.after_expiry = 0
        model = catalog.get_model(info.model)
        self.workers = max(1, info.tensor_parallel) * max(1, info.pipeline_parallel)
        # a descriptor per block and KV region: a layer of this worker's stage, K and V apart
        # (FlashAttention's layout; MLA's one latent per layer)
        self.regions = -(-model.n_layers // max(1, info.pipeline_parallel)) * (
            1 if model.is_mla else 2)

    # ---- producer ------------------------------------------------------------------------
    def prefill_finished(self, key: str, t: float) -> dict[str, Any] | None:
        """The kv_transfer_params of a finished prefill whose KV the scheduler holds."""
        held = self.sched.held.get(key)
        if held is None:
            return None
        self.holds[key] = t + self.config.abort_request_timeout_s
        return {"do_remote_prefill": True, "do_remote_decode": False,
                "remote_block_ids": list(held[0]), "remote_engine_id": self.engine_id,
                "remote_request_id": key, "remote_host": self.config.side_channel_host,
                "remote_port": self.port, "tp_size": self.info.tensor_parallel}

    def expire(self, t: float) -> None:
        for key, expires in list(self.holds.items()):
            if t >= expires:
                del self.holds[key]
                self.sched.release_held(key)
                self.expired += 1
                log.warning("Releasing expired KV blocks for request %s which were retrieved "
                            "by 0 remote worker(s) before lease expired.", key)

    def release_all(self) -> None:
        """Sleep discards the KV cache: every hold ends now."""
        for key in list(self.holds):
            del self.holds[key]
            self.sched.release_held(key)

    def _serve(self) -> None:
        while True:
            try:
                ident, _, raw = self.listener.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            msg = _dec.decode(raw)
            kind = msg[0]
            if kind == GET_META_MSG:
                reply = {"engine_id": self.engine_id, "chip": self.info.chip,
                         "chips": self.info.chip_count, "tp_size": self.info.tensor_parallel,
                         "block_size": self.info.capacity.block_size,
                         "compatibility": compatibility(self.info)}
                self.listener.send_multipart((ident, b"", _enc.encode(["meta", reply])))
            elif kind == "read":
                _, rid, token = msg
                ok = rid in self.holds
                if not ok:  # (vLLM counts it at the notification; here the read is told)
                    self.after_expiry += 1
                    log.error("Potentially invalid KV blocks for unrecognized request %s were "
                              "retrieved by a decode worker. They may have expired.", rid)
                self.listener.send_multipart(
                    (ident, b"", _enc.encode(["read_ok" if ok else "read_gone", token])))
            elif kind == "notif":  # the decode side is done reading: free the blocks
                rid = msg[1].rsplit(":", 1)[0]
                if self.holds.pop(rid, None) is not None:
                    self.sched.release_held(rid)

    # ---- consumer ------------------------------------------------------------------------
    def start(self, live: Any, key: str, params: dict[str, Any], num_prompt: int) -> bool:
        """Take a decode request whose prompt was prefilled remotely (False: not one)."""
        if not params.get("do_remote_prefill") or not params.get("remote_block_ids"):
            return False
        missing = [k for k in ("remote_engine_id", "remote_request_id", "remote_host",
                               "remote_port") if params.get(k) is None]
        if missing:  # vLLM: "Got invalid KVTransferParams ... will not utilize KVTransfer"
            log.warning("Got invalid KVTransferParams: %s. This request will not utilize "
                        "KVTransfer", params)
            return False
        sock = self._peer(str(params["remote_host"]), int(params["remote_port"]))
        engine = str(params["remote_engine_id"])
        if engine not in self.meta:
            sock.send_multipart((b"", _enc.encode([GET_META_MSG, 0])))
            self.meta[engine] = {}  # asked; the answer arrives before the read's
        self.pending[key] = _Transfer(live, key, params, max(0, num_prompt - 1))
        sock.send_multipart((b"", _enc.encode(["read", params["remote_request_id"], key])))
        return True

    def _peer(self, host: str, port: int) -> zmq.Socket:
        if (host, port) not in self.peers:
            sock = self.ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(f"tcp://{host}:{port}")
            self.poller.register(sock, zmq.POLLIN)
            self.peers[(host, port)] = sock
        return self.peers[(host, port)]

    def _answers(self, sock: zmq.Socket) -> None:
        while True:
            try:
                _, raw = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            kind, body = _dec.decode(raw)
            if kind == "meta":
                self.meta[body["engine_id"]] = body
            elif (tr := self.pending.get(body)) is not None:
                self._answered(tr, kind == "read_ok")

    def _answered(self, tr: _Transfer, ok: bool) -> None:
        meta = self.meta.get(str(tr.params["remote_engine_id"])) or {}
        if ok and meta.get("compatibility") != compatibility(self.info):
            log.error("NIXL compatibility check failed with remote engine %s",
                      tr.params["remote_engine_id"])
            ok = False
        # the side channel's round trip costs nothing on the emulated timeline (the host's
        # IPC is not the device's): the request joins the scheduler as if it had come now
        tr.answered = True
        if not ok:
            self.failures += 1
            tr.failed, tr.num_tokens = True, 0
            log.error("NIXL transfer failed for request %s: the prefill side does not hold "
                      "its blocks (kv_load_failure_policy=%s)", tr.live.rid,
                      self.config.kv_load_failure_policy)
            return
        mine, theirs = catalog.get_chip(self.info.chip), catalog.get_chip(meta["chip"])
        tr.link = kv_link(theirs, mine, self.config.link)
        tr.lanes = min(self.info.chip_count, meta["chips"])

    def ready(self) -> list[_Transfer]:
        """Reads the prefill pod has answered: their requests join the scheduler, expecting
        their pull (`num_remote_tokens`; it starts when the scheduler admits them) — or,
        after a failed read, to prefill locally (or to end, if the policy is fail)."""
        done = [tr for tr in self.pending.values() if tr.answered]
        for tr in done:
            del self.pending[tr.key]
            if tr.failed:
                continue
            if not tr.num_tokens:  # a one-token prompt: nothing to pull, the blocks go now
                self._notify(tr)
                continue
            self.pulling[tr.key] = tr
            tr.live.req.num_remote_tokens = tr.num_tokens
        return done

    def _timing(self, key: str, num_tokens: int, start: float) -> float:
        """A pull of `num_tokens` tokens' KV starts at emulated `start`, after the pulls
        before it on the inbound link: when it ends (`RemotePulls.timing`)."""
        tr = self.pulling[key]
        tr.num_tokens = num_tokens
        tr.nbytes = self.info.kv_bytes_per_token * num_tokens
        tr.seconds = transfer_seconds(tr.nbytes, tr.link, tr.lanes)
        self.link_free = max(start, self.link_free) + tr.seconds
        return self.link_free

    def _ended(self, key: str, landed: bool) -> None:
        """A pull landed, or its request ended first: the prefill pod may free its blocks
        (`RemotePulls.on_end`). A landed pull is counted and observed per worker."""
        tr = self.pulling.pop(key)
        self._notify(tr)
        if landed:
            self.bytes += tr.nbytes
            self.seconds += tr.seconds
            self.transfers += 1
            blocks = -(-tr.num_tokens // self.info.capacity.block_size)
            self.xfers += [(tr.seconds, tr.nbytes / self.workers, blocks * self.regions)
                           ] * self.workers

    def abort(self, key: str) -> bool:
        """A request aborted before its scheduler took it (its read unanswered, or answered
        and the request still held back, as while asleep): tell the prefill side to free its
        blocks (as vLLM's request_finished does for an unscheduled remote prefill). A request
        the scheduler has is told by its abort (`RemotePulls.finish`)."""
        tr = self.pending.pop(key, None)
        if tr is None and key in self.pulling and key not in self.pulls.expected \
                and key not in self.pulls.loads:
            tr = self.pulling.pop(key)
        if tr is None:
            return False
        self._notify(tr)
        return True

    def _notify(self, tr: _Transfer) -> None:
        p = tr.params
        sock = self._peer(str(p["remote_host"]), int(p["remote_port"]))
        sock.send_multipart((b"", _enc.encode(
            ["notif", f"{p['remote_request_id']}:{self.info.tensor_parallel}"])))

    # ---- the loop's hooks ----------------------------------------------------------------
    def handle(self, events: dict) -> None:
        if events.get(self.listener, 0) & zmq.POLLIN:
            self._serve()
        for sock in self.peers.values():
            if events.get(sock, 0) & zmq.POLLIN:
                self._answers(sock)

    def next_deadline(self) -> float | None:
        """The next hold's expiry (pulls land on the scheduler's deadlines)."""
        return min(self.holds.values(), default=None)

    def close(self) -> None:
        for sock in (self.listener, *self.peers.values()):
            sock.close(linger=0)


def compatibility(info: DeploymentInfo) -> str:
    """What must match between the pods for their KV to be interchangeable (vLLM hashes the
    model, dtype, KV heads, head size, layers and cache dtype: the same facts here)."""
    return f"{info.model}/{info.quant}/{info.kv_bytes_per_token:g}"
