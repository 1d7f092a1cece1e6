"""The doppelchip.v1.Inference servicer: convert, hand to the engine, convert back."""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator

import grpc

from doppelchip.v1 import inference_pb2 as pb
from doppelchip.v1 import inference_pb2_grpc as pb_grpc
from server import convert
from server.engine.interface import EngineError
from server.engine.logs import request_log
from server.fleet import Fleet, UnknownDeployment

log = logging.getLogger("doppelchip.service")


class InferenceServicer(pb_grpc.InferenceServicer):
    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self.draining = False
        self.metrics_port = 0  # set by the app once its metrics server listens

    async def Generate(
        self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.GenerateResponse]:
        rid = request.request_id or f"req-{uuid.uuid4().hex}"
        rlog = request_log(log, rid)
        if self.draining:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "server is draining")
        try:
            engine = self.fleet.resolve(request.deployment, request.model)
            handle = engine.submit(convert.to_engine_request(request, rid))
        except UnknownDeployment as e:
            rlog.info("rejected: %s", e)
            await context.abort(grpc.StatusCode.NOT_FOUND, str(e))
        except EngineError as e:
            rlog.info("rejected: %s", e)
            await context.abort(convert.status_code(e), str(e))
        await context.send_initial_metadata((("x-request-id", rid),))
        finished = False
        try:
            async for chunk in handle.outputs():
                finished = chunk.finish is not None
                yield convert.to_response(chunk, rid, engine.name)
        finally:
            if not finished:  # client cancel, deadline, or a failed write: free it at once
                rlog.info("stream ended early (cancel or deadline); aborting in %s", engine.name)
                engine.abort(rid)

    async def ListDeployments(
        self, request: pb.ListDeploymentsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListDeploymentsResponse:
        return pb.ListDeploymentsResponse(
            deployments=[
                convert.to_deployment(e.status(), name == self.fleet.default_name)
                for name, e in self.fleet.engines.items()
            ],
            default_deployment=self.fleet.default_name,
            time_scale=self.fleet.config.server.time_scale,
            metrics_port=self.metrics_port,
        )

    async def GetDeployment(
        self, request: pb.GetDeploymentRequest, context: grpc.aio.ServicerContext
    ) -> pb.Deployment:
        try:
            engine = self.fleet.get(request.name)
        except UnknownDeployment as e:
            await context.abort(grpc.StatusCode.NOT_FOUND, str(e))
        return convert.to_deployment(engine.status(), request.name == self.fleet.default_name)
