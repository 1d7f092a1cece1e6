"""How a deployment's chips are used: tensor, pipeline, data (attention) and expert parallelism.

``count = tp × pp × dp``; ``ep`` divides a stage's ``tp × dp`` chips (see ``DeploymentSpec``).
Experts are sharded over ``expert_shards`` chips: ``tp`` when ``ep`` is 1 (each attention
replica keeps a tensor-parallel copy), all ``tp × dp`` chips of the stage otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass

from devices.deployment import DeploymentSpec
from devices.errors import PlacementError
from devices.specs import ChipSpec, EngineSpec, ModelSpec


@dataclass(frozen=True)
class Parallelism:
    tp: int
    pp: int
    dp: int
    ep: int

    @property
    def chips(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def stage_chips(self) -> int:
        return self.tp * self.dp

    @property
    def expert_shards(self) -> int:
        return self.tp if self.ep == 1 else self.tp * self.dp

    def experts_per_chip(self, total: float, n_experts: int) -> float:
        """Of ``total`` (a MoE layer's expert bytes, parameters ...), what the fullest chip of
        a stage holds: ``total / expert_shards``; when ``ep`` > 1 ranks do not divide the
        ``n_experts`` experts, the ranks that get one more (vLLM's determine_expert_map gives
        the first ``n_experts mod ep`` ranks ``n_experts // ep + 1``) hold ceil(E / shards)."""
        shards = self.expert_shards
        if self.ep == 1 or not n_experts or n_experts % shards == 0:
            return total / shards
        return total * -(-n_experts // shards) / n_experts


def resolve_parallelism(spec: DeploymentSpec, chip: ChipSpec, model: ModelSpec,
                        engine: EngineSpec) -> Parallelism:
    """Fill the defaults and check the relations; PlacementError says what is wrong."""
    ep = spec.ep or 1
    pp = spec.pp or 1
    if spec.tp is not None:
        tp = spec.tp
    elif spec.ep and spec.ep > 1:
        tp = 1  # experts parallel, attention data parallel
    else:
        tp = (spec.count // pp) if spec.count else 1
    count = spec.count if spec.count is not None else tp * pp * (ep if tp == 1 else 1)
    if min(tp, pp, ep, count) < 1 or count % (tp * pp):
        raise PlacementError(f"count {count} is not tp {tp} × pp {pp} × dp (a whole number)")
    dp = count // (tp * pp)
    if engine.tp_divides_heads and model.n_heads % tp:
        raise PlacementError(f"Total number of attention heads ({model.n_heads}) must be "
                             f"divisible by tensor parallel size ({tp}) ({engine.name} shards "
                             "the heads over the TP ranks)")
    if ep > 1:
        if not model.is_moe:
            raise PlacementError(f"ep {ep}: {model.name} has no experts to shard")
        if not engine.expert_parallel:
            raise PlacementError(f"{engine.name} does not run expert parallelism")
        if (tp * dp) % ep:  # (experts need not divide evenly: experts_per_chip)
            raise PlacementError(
                f"ep {ep} must divide the {tp * dp} chips of a stage (tp {tp} × dp {dp})")
    if count > 1 and chip.link_bw_bps <= 0:
        raise PlacementError(f"{chip.id} has no chip-to-chip link: use a single chip")
    return Parallelism(tp=tp, pp=pp, dp=dp, ep=ep)
