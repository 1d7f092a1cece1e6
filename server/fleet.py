"""The fleet: every deployment's engine, by name, and which one is the default."""

from __future__ import annotations

from server.config import DeploymentConfig, FleetConfig
from server.engine.async_engine import AsyncEngine
from server.engine.interface import Engine


class UnknownDeployment(LookupError):
    """No deployment has that name (NOT_FOUND)."""


def build_engine(dep: DeploymentConfig, time_scale: float) -> Engine:
    """The engine of one deployment (FAILED, with the reason, if it cannot be placed)."""
    return AsyncEngine(dep, time_scale)


class Fleet:
    def __init__(self, config: FleetConfig) -> None:
        self.config = config
        self.default_name = config.default_deployment
        self.engines: dict[str, Engine] = {
            d.name: build_engine(d, config.server.time_scale) for d in config.deployments
        }

    async def start(self) -> None:
        for engine in self.engines.values():
            await engine.start()

    async def stop(self) -> None:
        for engine in self.engines.values():
            await engine.stop()

    def num_unfinished(self) -> int:
        return sum(e.num_unfinished() for e in self.engines.values())

    def get(self, name: str) -> Engine:
        try:
            return self.engines[name]
        except KeyError:
            raise UnknownDeployment(
                f"unknown deployment {name!r}; deployments: {', '.join(self.engines)}"
            ) from None

    def resolve(self, deployment: str, model: str) -> Engine:
        """The engine for a request's (deployment, model) pair, as the wire API defines it."""
        if deployment:
            engine = self.get(deployment)
            status = engine.status()
            if model and model != status.model:
                raise UnknownDeployment(
                    f"deployment {deployment!r} serves {status.model!r}, not {model!r}"
                )
            return engine
        if not model:
            return self.get(self.default_name)
        candidates = [e for e in self.engines.values() if e.status().model == model]
        if not candidates:
            raise UnknownDeployment(f"no deployment serves model {model!r}")
        ready = [e for e in candidates if e.status().state.value == "ready"]
        return (ready or candidates)[0]
