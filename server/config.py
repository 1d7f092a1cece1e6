"""The fleet file: one TOML document describing the server and its deployments.

```toml
[server]                      # all optional; CLI flags override
host = "127.0.0.1"
port = 50051
metrics_port = 8000
default_deployment = "vllm-h100"
time_scale = 1.0              # 0.01: emulated seconds pass 100x faster
drain_grace_s = 10.0
event_loop = "auto"           # auto | uvloop | asyncio

[[deployments]]
name = "vllm-h100"
model = "llama-3.1-8b"
quant = "bf16"
chip = "h100-sxm"
engine = "vllm"
count = 1                     # optional: tensor_parallel, pipeline_parallel, max_model_len, ...
```
Unknown keys are errors (a typo never silently falls back to a default).
"""

from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import dataclass, field, fields
from importlib import resources
from pathlib import Path
from typing import Any


class ConfigError(ValueError):
    """The fleet file is wrong; the message says where and what."""


@dataclass(frozen=True)
class DeploymentConfig:
    name: str
    model: str
    quant: str
    chip: str
    engine: str
    count: int = 1
    tensor_parallel: int = 1
    pipeline_parallel: int = 1
    max_model_len: int = 8192
    max_num_seqs: int = 256
    max_waiting: int = 1024
    block_size: int = 16
    kv_blocks: int = 8192  # placeholder engine only: the scheduler-driven engine derives it
    decode_step_s: float = 0.02  # placeholder engine only
    prefill_token_s: float = 1e-4  # placeholder engine only


@dataclass(frozen=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 50051
    metrics_port: int = 8000
    default_deployment: str = ""
    time_scale: float = 1.0
    drain_grace_s: float = 10.0
    event_loop: str = "auto"


@dataclass(frozen=True)
class FleetConfig:
    server: ServerConfig = field(default_factory=ServerConfig)
    deployments: tuple[DeploymentConfig, ...] = ()

    @property
    def default_deployment(self) -> str:
        return self.server.default_deployment or (
            self.deployments[0].name if self.deployments else ""
        )

    def with_server(self, **overrides: Any) -> FleetConfig:
        """A copy whose server section has the given (non-None) values replaced."""
        changes = {k: v for k, v in overrides.items() if v is not None}
        return dataclasses.replace(self, server=dataclasses.replace(self.server, **changes))


_TYPES: dict[str, type] = {"int": int, "float": float, "str": str, "bool": bool}


def _typed(value: Any, type_name: str, where: str) -> Any:
    expected = _TYPES[type_name]
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, bool) != (expected is bool) or not isinstance(value, expected):
        raise ConfigError(f"{where} must be a {type_name}, got {value!r}")
    return value


def _build(cls: type, table: dict[str, Any], where: str) -> Any:
    known = {f.name: f for f in fields(cls)}
    unknown = sorted(set(table) - set(known))
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)}")
    missing = [n for n, f in known.items() if f.default is dataclasses.MISSING and n not in table]
    if missing:
        raise ConfigError(f"{where}: missing key(s) {', '.join(missing)}")
    return cls(**{k: _typed(v, str(known[k].type), f"{where}: {k}") for k, v in table.items()})


def parse_fleet(doc: dict[str, Any], source: str = "fleet file") -> FleetConfig:
    unknown = sorted(set(doc) - {"server", "deployments"})
    if unknown:
        raise ConfigError(f"{source}: unknown section(s) {', '.join(unknown)}")
    server = _build(ServerConfig, doc.get("server", {}), f"{source} [server]")
    if server.event_loop not in ("auto", "uvloop", "asyncio"):
        raise ConfigError(f"{source} [server]: event_loop must be auto, uvloop or asyncio")
    deployments = tuple(
        _build(DeploymentConfig, d, f"{source} deployments[{i}]")
        for i, d in enumerate(doc.get("deployments", []))
    )
    names = [d.name for d in deployments]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ConfigError(f"{source}: duplicate deployment name(s) {', '.join(dupes)}")
    if not deployments:
        raise ConfigError(f"{source}: no deployments")
    fleet = FleetConfig(server, deployments)
    if fleet.default_deployment not in names:
        raise ConfigError(
            f"{source}: default_deployment {fleet.default_deployment!r} is not one of {names}"
        )
    return fleet


def load_fleet(path: str | Path | None = None) -> FleetConfig:
    """The fleet at `path`, or the built-in default fleet."""
    if path is None:
        text = resources.files("server").joinpath("default_fleet.toml").read_text()
        return parse_fleet(tomllib.loads(text), "built-in default fleet")
    p = Path(path)
    try:
        doc = tomllib.loads(p.read_text())
    except OSError as e:
        raise ConfigError(f"cannot read fleet file {p}: {e.strerror}") from e
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{p}: not valid TOML: {e}") from e
    return parse_fleet(doc, str(p))
