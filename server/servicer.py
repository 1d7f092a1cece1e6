"""The doppelchip.v1.Inference servicer: convert, hand to the deployment, convert back.

`SamplingParams.n` > 1 runs n sequences at once (`server.frontend.parallel`: n engine requests
sharing the prompt's KV blocks, seeds seed + i). The response has no sequence index, so the
sequences are streamed one after the other: sequence 0's chunks up to and including its
`final`, then sequence 1's (its `index` starts again at 0), …; the stream ends after the n-th
`final`. The later sequences keep generating meanwhile; their tokens wait in their streams.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import AsyncIterator

import grpc

from doppelchip.v1 import inference_pb2 as pb
from doppelchip.v1 import inference_pb2_grpc as pb_grpc
from server import convert, wire
from server.engine.errors import EngineError
from server.engine.logs import request_log
from server.fleet import Fleet, UnknownDeployment
from server.frontend import lora, parallel, request_ids
from server.frontend.stream import StreamFailed
from server.wire import Undecodable

log = logging.getLogger("doppelchip.service")


class InferenceServicer(pb_grpc.InferenceServicer):
    def __init__(self, fleet: Fleet, time_scale: float, metrics_port: int,
                 frontend: int = 0) -> None:
        self.fleet = fleet
        self.frontend = str(frontend)  # which front-end process answered (initial metadata)
        self.time_scale = time_scale
        self.metrics_port = metrics_port
        self.draining = False

    async def Generate(
        self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.GenerateResponse]:
        if type(request) is Undecodable:
            await wire.reject(request, context)
        rid = request.request_id or f"req-{uuid.uuid4().hex}"
        rlog = request_log(log, rid)
        if self.draining:
            await wire.abort(context, grpc.StatusCode.UNAVAILABLE, "server is draining")
        try:
            request_ids.check(rid)
            client = self.fleet.resolve(request.deployment, request.model)
            n = convert.num_sequences(request)
            children = parallel.child_requests(lora.tag(  # --- LoRA (issue 13) ---
                client, request.model, convert.to_engine_request(request, rid)), n)
            streams = await parallel.submit_all(client, children, rid)
        except UnknownDeployment as e:
            rlog.info("rejected: %s", e)
            await wire.abort(context, grpc.StatusCode.NOT_FOUND, str(e))
        except EngineError as e:
            rlog.info("rejected: %s", e)
            await wire.abort(context, convert.status_code(e), str(e))
        finished = 0
        try:  # from here on every way out frees what the engine holds
            await wire.send_headers(context, (
                ("x-request-id", request_ids.metadata_value(rid)),
                ("x-doppelchip-frontend", self.frontend)))
            async with contextlib.aclosing(parallel.in_order(streams)) as chunks:
                async for chunk in chunks:
                    finished += chunk.finish is not None
                    yield convert.to_response(chunk, rid, client.name)
            wire.end_stream(context)
        except StreamFailed as e:
            await wire.abort(context, grpc.StatusCode.UNAVAILABLE, str(e))
        finally:
            if finished < len(streams):  # client cancel, deadline, failed write: free at once
                rlog.info("stream ended early (cancel or deadline); aborting in %s",
                          client.name)
                parallel.abort_all(client, streams)

    async def ListDeployments(
        self, request: pb.ListDeploymentsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListDeploymentsResponse:
        return pb.ListDeploymentsResponse(
            deployments=[
                convert.to_deployment(c.status(), name == self.fleet.default_name)
                for name, c in self.fleet.clients.items()
            ],
            default_deployment=self.fleet.default_name,
            time_scale=self.time_scale,
            metrics_port=self.metrics_port,
        )

    async def GetDeployment(
        self, request: pb.GetDeploymentRequest, context: grpc.aio.ServicerContext
    ) -> pb.Deployment:
        try:
            client = self.fleet.get(request.name)
        except UnknownDeployment as e:
            await wire.abort(context, grpc.StatusCode.NOT_FOUND, str(e))
        return convert.to_deployment(client.status(), request.name == self.fleet.default_name)
