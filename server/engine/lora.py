"""LoRA adapters in the engine: vLLM's options, the `--lora-modules` forms, and the adapter
registry an engine core keeps (the single writer: loads, unloads, what is resident).

vLLM's semantics followed (docs/LORA.md has the sources and the version):
- `--enable-lora`, `--max-loras` (default 1: adapters one batch may use), `--max-lora-rank`
  (default 16, one of vLLM's allowed ranks), `--max-cpu-loras` (default `max_loras`; must not
  be below it: adapters kept in host memory, LRU), `--lora-modules NAME=PATH` or vLLM's JSON
  `{"name", "path", "base_model_name"}` (plus doppelchip's optional `"rank"`, since no
  adapter_config.json is ever read: the path is recorded, not opened; default: max_lora_rank).
- Adapters get integer ids from 1 in load order (vLLM's `lora_id_counter`); 0 is the base
  model. A duplicate name is refused, an unknown one on unload is not found.
- Residency: the device holds at most `max_loras` adapters (GPU slots), host memory at most
  `max_cpu_loras` (an LRU, as vLLM's worker LoRA manager); a step that uses an adapter not on
  the device copies it there (`devices.lora`: its bytes over the host link), evicting the
  least recently used one when the slots are full.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

import msgspec

# vLLM's LoRAConfig.max_lora_rank choices (vllm/config/lora.py, MaxLoRARanks)
MAX_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


class LoraError(ValueError):
    """A LoRA option or request is wrong; `status` is the HTTP status vLLM answers with and
    `kind` its error type."""

    def __init__(self, message: str, status: int = 400, kind: str = "InvalidUserInput") -> None:
        super().__init__(message)
        self.status, self.kind = status, kind


class LoraAdapter(msgspec.Struct, frozen=True, array_like=True):
    """One registered adapter, as the engine publishes it to the front ends."""

    name: str
    id: int
    path: str
    base_model_name: str = ""
    rank: int = 16


@dataclass(frozen=True)
class LoraConfig:
    """A deployment's LoRA options (from `EngineOptions`), checked as vLLM checks them."""

    enabled: bool = False
    max_loras: int = 1
    max_lora_rank: int = 16
    max_cpu_loras: int | None = None
    modules: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.enabled:
            if self.modules:
                raise LoraError("lora_modules needs enable_lora = true (--enable-lora)")
            return
        if self.max_loras < 1:
            raise LoraError(f"max_loras ({self.max_loras}) must be >= 1")
        if self.max_lora_rank not in MAX_LORA_RANKS:
            raise LoraError(f"max_lora_rank ({self.max_lora_rank}) must be one of "
                            f"{', '.join(map(str, MAX_LORA_RANKS))}")
        if self.max_cpu_loras is not None and self.max_cpu_loras < self.max_loras:
            raise LoraError(f"max_cpu_loras ({self.max_cpu_loras}) must be >= max_loras "
                            f"({self.max_loras})")
        parse_modules(self.modules, self.max_lora_rank)

    @property
    def cpu_slots(self) -> int:
        return self.max_cpu_loras if self.max_cpu_loras is not None else self.max_loras


def parse_module(text: str, max_rank: int) -> tuple[str, str, str, int]:
    """(name, path, base_model_name, rank) of one `--lora-modules` value."""
    text = text.strip()
    if text.startswith("{"):
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as e:
            raise LoraError(f"invalid JSON in --lora-modules {text!r}: {e}") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("name"), str) \
                or not isinstance(doc.get("path"), str):
            raise LoraError(f"--lora-modules JSON needs string 'name' and 'path': {text!r}")
        unknown = set(doc) - {"name", "path", "base_model_name", "rank"}
        if unknown:
            raise LoraError(f"--lora-modules JSON: unknown key(s) {', '.join(sorted(unknown))}")
        name, path, base = doc["name"], doc["path"], doc.get("base_model_name") or ""
        rank = doc.get("rank", max_rank)
    else:
        name, sep, path = text.partition("=")
        if not sep:
            raise LoraError(f"--lora-modules expects NAME=PATH or JSON, got {text!r}")
        base, rank = "", max_rank
    if not name or not path:
        raise LoraError(f"--lora-modules needs a name and a path, got {text!r}")
    return name, path, base, check_rank(rank, max_rank)


def check_rank(rank: object, max_rank: int) -> int:
    if not isinstance(rank, int) or isinstance(rank, bool) or not 1 <= rank <= max_rank:
        raise LoraError(f"LoRA rank {rank!r} must be an integer in [1, {max_rank}] "
                        "(max_lora_rank)")
    return rank


def parse_modules(texts: Iterable[str], max_rank: int) -> list[tuple[str, str, str, int]]:
    out = [parse_module(t, max_rank) for t in texts]
    names = [m[0] for m in out]
    if len(set(names)) != len(names):
        raise LoraError(f"--lora-modules names an adapter twice: {names}")
    return out


class LoraRegistry:
    """The adapters of one engine core and where each one is (device slots, host LRU).

    Written only by the engine core: `load`/`unload` answer the front ends' runtime requests;
    `activate(ids)` is called for every step with the adapters it runs and returns the ones
    that had to be copied onto the device."""

    def __init__(self, config: LoraConfig, base_names: tuple[str, ...] = ()) -> None:
        self.config = config
        self.base_names = base_names
        self.adapters: dict[str, LoraAdapter] = {}
        self.by_id: dict[int, LoraAdapter] = {}
        # every id ever loaded -> (name, path): what vLLM keys its blocks' hashes with
        self.hash_keys: dict[int, tuple[str, str]] = {}
        self._next_id = 1
        self.device: OrderedDict[int, None] = OrderedDict()  # LRU: oldest first
        self.host: OrderedDict[int, None] = OrderedDict()
        self.version = 0  # bumped at every load/unload (front ends re-read the list)
        self.loads = 0  # adapter copies onto the device
        for name, path, base, rank in parse_modules(config.modules, config.max_lora_rank):
            self.load(name, path, rank, base)

    def load(self, name: str, path: str, rank: int | None = None,
             base_model_name: str = "") -> LoraAdapter:
        """Register an adapter (vLLM's checks and messages); it is pre-loaded into host
        memory, as vLLM's add_lora does."""
        if not self.config.enabled:
            raise LoraError("LoRA is not enabled on this deployment (--enable-lora)")
        if not name or not path:
            raise LoraError("Both 'lora_name' and 'lora_path' must be provided.")
        if name in self.adapters:
            raise LoraError(f"The lora adapter '{name}' has already been loaded. If you want "
                            "to load the adapter in place, set 'load_inplace' to True.")
        if name in self.base_names:
            raise LoraError(f"'{name}' is the base model's name")
        rank = check_rank(self.config.max_lora_rank if rank is None else rank,
                          self.config.max_lora_rank)
        if base_model_name and base_model_name not in self.base_names:
            base_model_name = ""  # vLLM keeps a base_model_name only if it is a base model
        adapter = LoraAdapter(name, self._next_id, path, base_model_name, rank)
        self._next_id += 1
        self.adapters[name] = adapter
        self.by_id[adapter.id] = adapter
        self.hash_keys[adapter.id] = (adapter.name, adapter.path)
        self._touch_host(adapter.id)
        self.version += 1
        return adapter

    def unload(self, name: str) -> LoraAdapter:
        if not name:
            raise LoraError("'lora_name' needs to be provided to unload a LoRA adapter.")
        adapter = self.adapters.pop(name, None)
        if adapter is None:
            raise LoraError(f"The lora adapter '{name}' cannot be found.", 404, "NotFoundError")
        del self.by_id[adapter.id]
        self.device.pop(adapter.id, None)
        self.host.pop(adapter.id, None)
        self.version += 1
        return adapter

    def _touch_host(self, lora_id: int) -> None:
        self.host[lora_id] = None
        self.host.move_to_end(lora_id)
        while len(self.host) > self.config.cpu_slots:
            evicted, _ = self.host.popitem(last=False)
            self.device.pop(evicted, None)

    def activate(self, ids: Iterable[int]) -> list[LoraAdapter]:
        """The adapters a step runs (ids > 0, at most max_loras distinct: the scheduler's
        rule): mark them used, and return those copied onto the device for it."""
        loaded = []
        for lora_id in ids:
            adapter = self.by_id.get(lora_id)
            if adapter is None:
                continue
            self._touch_host(lora_id)
            if lora_id in self.device:
                self.device.move_to_end(lora_id)
                continue
            while len(self.device) >= self.config.max_loras:
                self.device.popitem(last=False)
            self.device[lora_id] = None
            self.loads += 1
            loaded.append(adapter)
        return loaded

    def listing(self) -> list[LoraAdapter]:
        return list(self.adapters.values())
