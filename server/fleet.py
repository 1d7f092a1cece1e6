"""A front end's fleet: every deployment's client, by name, which one is the default, and the
model names clients may ask for.

`models` is the one place a served model name maps to deployments (the HTTP API's `model`,
the wire API's `model`, `/v1/models`): a deployment serves its `--served-model-name`s, or with
none set its catalogue model id."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from server.engine.interface import DeploymentState
from server.frontend.deployment import DeploymentClient
from server.ipc import messages as m


class UnknownDeployment(LookupError):
    """No deployment has that name (NOT_FOUND)."""


class Fleet:
    def __init__(self, clients: list[DeploymentClient], default_name: str) -> None:
        self.clients = {c.name: c for c in clients}
        self.default_name = default_name
        self.models: dict[str, list[DeploymentClient]] = {}
        for c in clients:
            for name in served_names(c):
                self.models.setdefault(name, []).append(c)

    def model_names(self) -> list[str]:
        return list(self.models) + [a.name for c in self.clients.values()
                                    for a in c.lora.adapters()]

    # --- LoRA (issue 13) ---
    def adapter_owner(self, model: str) -> DeploymentClient | None:
        """The deployment with a LoRA adapter named `model` (a base model's name wins)."""
        return next((c for c in self.clients.values() if c.lora.get(model) is not None), None)

    def get(self, name: str) -> DeploymentClient:
        try:
            return self.clients[name]
        except KeyError:
            raise UnknownDeployment(
                f"unknown deployment {name!r}; deployments: {', '.join(self.clients)}"
            ) from None

    async def control(self, make: Callable[[int, int], Any]) -> list[m.Admission]:
        """A control command (`DeploymentClient.control`'s `make`) sent to every deployment,
        answered by all of their engines: the answers, or the first refusal raised."""
        answers = await asyncio.gather(*(c.control(make) for c in self.clients.values()))
        return [a for per_deployment in answers for a in per_deployment]

    def num_unfinished(self) -> int:
        return sum(len(c.streams) for c in self.clients.values())

    def resolve(self, deployment: str, model: str) -> DeploymentClient:
        """The deployment for a request's (deployment, model) pair, as the wire API defines it."""
        if deployment:
            client = self.get(deployment)
            if model and not serves(client, model) and client.lora.get(model) is None:
                raise UnknownDeployment(
                    f"deployment {deployment!r} serves {client.info.model_name!r}, not {model!r}"
                )
            return client
        if not model:
            return self.get(self.default_name)
        candidates = self.models.get(model, [])
        if not candidates:
            if (client := self.adapter_owner(model)) is not None:  # --- LoRA (issue 13) ---
                return client
            raise UnknownDeployment(f"no deployment serves model {model!r}")
        ready = [c for c in candidates if c.status().state is DeploymentState.READY]
        return (ready or candidates)[0]


def served_names(client: DeploymentClient) -> tuple[str, ...]:
    """The model names a request may send to reach this deployment: its served names, or (with
    none set) its catalogue model id."""
    info = client.info
    return tuple(info.served_model_names) or (info.model,)


def serves(client: DeploymentClient, model: str) -> bool:
    return model in served_names(client)


def choose_default(configured: str, explicit: bool,
                   deployments: list[tuple[str, bool, str]]) -> tuple[str, str]:
    """The fleet's default deployment and why, from the configured one (`explicit`: named
    by `default_deployment`, else the first listed) and each deployment's (name, placed,
    failure) in fleet order. A deployment that could not be placed (FAILED) is never the
    default while another was placed: plain requests would all fail. With none placed the
    configured name stays (every request fails with its reason either way)."""
    placed = {name: ok for name, ok, _ in deployments}
    failure = {name: why for name, _, why in deployments}
    source = "default_deployment" if explicit else "the first deployment listed"
    if placed.get(configured, False):
        return configured, f"{source}, placed"
    first = next((name for name, ok, _ in deployments if ok), None)
    if first is None:
        return configured, f"{source}; no deployment could be placed"
    return first, (f"{source} {configured!r} could not be placed ({failure.get(configured)}); "
                   f"{first!r} is the first deployment that was")
