"""A deployment's options, as a fleet file's `[[deployments]]` keys and `serve`/`simulate`
flags give them (`EngineOptions`), with vLLM's start-up checks of the ones that depend on each
other; `build.py` turns them into an engine core.

Why apart from `build.py`: the options are the configuration surface (read by the fleet
loader, the command line, the engine process and the simulator), the build is one function
that assembles a core from them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from devices import DeploymentSpec, SpeculativeConfig, catalog
from devices.hf_config import checkpoint_kv_cache_dtype
from devices.specs import ChipSpec, EngineSpec
from server.engine import hf_overrides, pooler_config
from server.engine.lora import LoraConfig
from server.engine.pooler_config import PoolerOptions
from server.engine.scheduler_defaults import default_seqs


@dataclass(frozen=True)
class EngineOptions:
    """One deployment as the engine builds it. `None` means "the engine's default"."""

    name: str
    model: str
    quant: str
    chip: str
    engine: str
    count: int | None = None
    tp: int | None = None
    pp: int | None = None
    ep: int | None = None  # expert parallelism (MoE): see devices.DeploymentSpec
    n_gpu_layers: int | None = None
    built_for: str | None = None
    start: str = "prebuilt"  # prebuilt | cold
    max_model_len: int | None = None
    max_num_seqs: int | None = None
    max_num_active_seqs: int | None = None  # vLLM's: requests admitted into RUNNING (default
    #                                         max_num_seqs, which still sizes memory)
    max_num_batched_tokens: int | None = None
    max_waiting: int = 1024  # accepted beyond the free batch seats (intake.queue_is_full)
    max_num_queued_reqs: int | None = None  # vLLM's: unfinished requests (intake.QueueLimits)
    max_num_queued_tokens: int | None = None  # vLLM's: prompt tokens not yet past prefill
    long_prefill_token_threshold: int = 0  # vLLM's: a step's cap per request (SchedulerConfig)
    long_prefill_token_threshold_adaptive: bool = False
    max_num_inflight_kv_loads: int | None = None  # vLLM 0.34.0's: async KV loads holding blocks
    cache_aware_admission_window: int = 0  # vLLM 0.34.0's: waiting requests reordered by
    cache_aware_admission_threshold: float = 0.5  # their cached prefix, from this KV usage on
    max_logprobs: int = 20  # vLLM's --max-logprobs: (prompt) logprobs a request may ask; -1 all
    block_size: int | None = None  # tokens per KV block (None: the engine's on this chip,
    #                                EngineSpec.block_size_on: vLLM 0.34.0's 64, 16 on ROCm)
    kv_blocks: int | None = None  # cap the KV pool (vLLM's num_gpu_blocks_override)
    policy: str | None = None  # fcfs | priority | lpm
    prefix_cache: bool | None = None
    chunked_prefill: bool | None = None  # vLLM's --enable-chunked-prefill (None: the engine's
    #                                      and the model's default; scheduler_defaults.py)
    kv_layout: str | None = None  # paged | contiguous
    batching: str | None = None  # continuous | static
    output_len_mean: float = 128.0  # mean output length when EOS is sampled (not ignore_eos)
    output_len_dist: str = "geometric"  # geometric | fixed (every request exactly the mean)
    jitter: float = 0.0  # sigma of the seeded log-normal step-time noise (0: deterministic)
    seed: int = 0
    shape_policy: str = "hold"  # hold | recompile (static-compile engines: see above)
    jump_forward: bool | None = None  # structured output: append grammar-forced tokens without
    #                                   decoding them (default: the engine's catalogue entry)
    max_grammar_bytes: int = 65536  # largest constraint (regex, schema, grammar) accepted
    max_grammar_depth: int = 100  # deepest nesting of brackets a constraint may have
    max_prompt_bytes: int = 2_000_000  # largest prompt text, checked before tokenizing
    max_stop_strings: int = 256  # stop strings per request
    max_stop_bytes: int = 1024  # longest stop string (text that long is held back)
    kv_cache_dtype: str = "auto"  # auto (the quantisation's) | fp8
    speculative_config: str | None = None  # vLLM's JSON (+ "acceptance_rate"): devices.speculative
    stream_interval: int | None = None  # tokens per streamed message (None: the server's)
    data_parallel_size: int = 1  # engine cores (ranks), each a copy of the deployment (a
    #                              MoE model's share its experts: devices.place_rank)
    data_parallel_size_local: int | None = None  # of those, the ranks this server runs
    data_parallel_start_rank: int = 0  # the first of them (vLLM's hybrid/external LB)
    served_model_name: tuple[str, ...] = ()  # names clients send; the first is the model_name
    #                                          label (none: the catalogue model id)
    # --- KV events (issue 13): server/engine/kv_events_config.py, docs/KV_EVENTS.md ---
    kv_events_config: str | None = None  # vLLM's --kv-events-config JSON
    prefix_caching_hash_algo: str = "sha256"  # vLLM's --prefix-caching-hash-algo
    kv_events_port_offset: int = 0  # set by the supervisor in fleet mode, never by users
    kv_events_wire: str = "vllm"  # "sglang" on a pod imitating SGLang: set by the supervisor
    # --- LoRA (issue 13): vLLM's flags (server/engine/lora.py, docs/LORA.md) ---
    enable_lora: bool = False
    max_loras: int = 1  # distinct adapters one batch (step) may run
    max_lora_rank: int = 16
    max_cpu_loras: int | None = None  # adapters kept in host memory (default: max_loras)
    lora_modules: tuple[str, ...] = ()  # NAME=PATH or vLLM's JSON {"name", "path", ...}
    # --- P/D and sleep mode (issue 13) ---
    kv_transfer_config: str | None = None  # vLLM's JSON (server/engine/kv_transfer.py)
    # --- vLLM's CPU KV offloading: server/engine/kv_offload.py, docs/KV_OFFLOAD.md ---
    kv_offloading_size: float | None = None  # GiB of host memory for the CPU tier (all chips)
    kv_offloading_backend: str = "native"  # native | lmcache (not emulated)
    enable_sleep_mode: bool = False  # vLLM's flag: sleep mode is always available; with it,
    #                                  vLLM 0.34.0's /checkpoint/* routes (server/http/checkpoint)
    checkpoint_prepare_on_startup: bool = False  # vLLM 0.34.0's: start prepared for a process
    #                                              checkpoint (needs enable_sleep_mode)
    # vLLM 0.34.0's fault tolerance (server/engine_proc/sentinel.py): a fault waits for an
    # instruction instead of ending the engine; its config JSON (engine_recovery_timeout_sec)
    enable_fault_tolerance: bool = False
    fault_tolerance_config: str | None = None
    # vLLM's --hf-overrides JSON, --runner and --convert: Matryoshka embeddings, and a
    # generative checkpoint served as an embedding model or a classifier (server/engine/
    # hf_overrides, docs/EMBEDDINGS.md)
    hf_overrides: str | None = None
    runner: str | None = None  # auto | generate | pooling | draft (None: auto)
    convert: str | None = None  # auto | none | embed | classify (None: auto)
    chat_template: str | None = None  # vLLM's --chat-template: a cross-encoder's pair prompt
    #                                   (a file or the template; server/engine/score_template)
    pooler_config: str | None = None  # vLLM's --pooler-config JSON (server/engine/pooler_config)

    def check_vllm_config(self) -> None:
        """vLLM 0.34.0's start-up checks of options that need another (ModelConfig,
        VllmConfig; their words): a ValueError."""
        if self.checkpoint_prepare_on_startup and not self.enable_sleep_mode:
            raise ValueError("checkpoint_prepare_on_startup requires enable_sleep_mode")
        if self.recovery_timeout_s() is not None and self.local_ranks != 1:
            raise ValueError("Fault tolerance requires external load balancer mode "
                             "(--data-parallel-external-lb or --data-parallel-rank). Internal LB "
                             "mode is not supported.")
        if self.per_request_spec_decode_metrics != "none" and not self.speculative_config:
            raise ValueError("--per-request-spec-decode-metrics requires speculative decoding "
                             "to be enabled (via --speculative-config).")

    def recovery_timeout_s(self) -> float | None:
        """Fault tolerance's `engine_recovery_timeout_sec` (vLLM's FaultToleranceConfig, 120
        by default), or None when it is off; a config turns it on, as vLLM's EngineArgs does.
        ValueError when the config is not what vLLM accepts."""
        text = self.fault_tolerance_config
        if text is None:
            return 120.0 if self.enable_fault_tolerance else None
        try:
            config = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"fault_tolerance_config is not JSON: {e}") from None
        if not isinstance(config, dict) or set(config) - {"engine_recovery_timeout_sec"}:
            raise ValueError("fault_tolerance_config takes one key, engine_recovery_timeout_sec")
        timeout = config.get("engine_recovery_timeout_sec", 120)
        if not isinstance(timeout, int) or isinstance(timeout, bool) or timeout < 0:
            raise ValueError("engine_recovery_timeout_sec must be a whole number of seconds")
        return float(timeout)

    def pooler(self) -> PoolerOptions:
        """The parsed `--pooler-config` (ValueError, in vLLM's words, when it is wrong)."""
        return pooler_config.parse(self.pooler_config)

    def conversion(self) -> hf_overrides.Conversion:
        """How the checkpoint is served (ValueError when vLLM would not start)."""
        if not (self.hf_overrides or self.runner or self.convert):
            return hf_overrides.Conversion()  # as published (whatever the model)
        model = catalog.get_model(self.model)
        return hf_overrides.conversion(self.hf_overrides, self.runner, self.convert,
                                       model.name, model.pooling_task)

    def lora_config(self) -> LoraConfig:
        """The LoRA options, checked (LoraError, a ValueError, when one is wrong)."""
        return LoraConfig(self.enable_lora, self.max_loras, self.max_lora_rank,
                          self.max_cpu_loras, self.lora_modules)
    # --- failure injection (issue 13): docs/FAULTS.md; server/engine/faults.py ---
    failure_injection_rate: float = 0.0  # percent of generation requests refused (llm-d-sim)
    failure_types: tuple[str, ...] = ()  # llm-d-inference-sim's type names (none: all six)
    failure_injection_seed: int | None = None  # seed of every fault draw (None: `seed`)
    fault_slowdown: tuple[str, ...] = ()  # "at=T,for=D,factor=F" | "rate=R,for=D,factor=F"
    fault_hang: tuple[str, ...] = ()  # "at=T,for=D" | "rate=R,for=D"
    fault_crash: tuple[str, ...] = ()  # "at=T" | "rate=R"
    fault_lost_chips: tuple[str, ...] = ()  # "at=T,chips=K[,for=D]" | "rate=R,chips=K,for=D"
    fault_stream_cut: tuple[str, ...] = ()  # "after=K,at=T,for=D" | "after=K,percent=P"
    # --- virtual-time clusters (issue 16): sim/cluster.py, docs/LOAD.md ---
    replicas: int = 1  # copies of this deployment behind a router (`simulate --router`)
    role: str = "both"  # prefill | decode | both: its part in a disaggregated fleet (sim/pd.py)
    slo_classes: tuple[str, ...] = ()  # SLO classes its pool serves (none: any; sim/pools.py)
    # --- end virtual-time clusters ---
    # --- autoscale (issue 16): sim/autoscale.py, docs/AUTOSCALING.md ---
    autoscaling: str | None = None  # "metric=waiting,target=4,min=1,max=8" (the file's table)
    # --- end autoscale ---
    # --- vLLM's --kv-cache-metrics: server/engine/kv_metrics.py, docs/OBSERVABILITY.md ---
    kv_cache_metrics: bool = False  # the KV residency histograms (vllm:kv_block_*_seconds)
    kv_cache_metrics_sample: float = 0.01  # share of the blocks handed out that are followed
    per_request_spec_decode_metrics: str = "none"  # none | summary | detailed: each answer's
    #                                    metrics.speculative_decoding (server/engine/spec_metrics)
    # --- vLLM's --gpu-memory-utilization and --enforce-eager (docs/VLLM_SERVE.md) ---
    gpu_memory_utilization: float | None = None  # the engine's memory share (None: its default)
    kv_cache_memory_bytes: int | None = None  # KV bytes per chip, whatever the share (vLLM's)
    cpu_offload_gb: float = 0.0  # GiB of weights per chip read from host memory (vLLM's)
    enforce_eager: bool = False  # no captured graphs: the host launches every kernel
    model_path: str = ""  # what vLLM's --model named (`vllm serve REPO`): /v1/models' root

    @property
    def local_ranks(self) -> int:
        """How many data-parallel ranks this server runs: `data_parallel_start_rank` on."""
        return self.data_parallel_size_local or self.data_parallel_size

    def rank_problem(self) -> str:
        """What is wrong with the data-parallel ranks asked for ("" when nothing)."""
        first, n, size = self.data_parallel_start_rank, self.local_ranks, self.data_parallel_size
        if first < 0 or n < 1 or first + n > size:
            return (f"data_parallel_start_rank {first} and data_parallel_size_local {n} name "
                    f"ranks outside 0..{size - 1} (data_parallel_size {size})")
        return ""

    def block_size_on(self, engine: EngineSpec, chip: ChipSpec, mla: bool) -> int:
        """Tokens per KV block: `block_size` as given, else the engine's on `chip` for a model
        with latent attention or not (`mla`) and with a KV connector or not (a
        `kv_transfer_config`, or the offloading one `kv_offloading_size` configures)."""
        connector = bool(self.kv_transfer_config or self.kv_offloading_size)
        return self.block_size or engine.block_size_on(chip, mla=mla, connector=connector)

    @property
    def cache_dtype(self) -> str:
        """vLLM's resolved `--kv-cache-dtype` (its cache_config_info label): as given, or for
        `auto` what the checkpoint `vllm serve` named declares ('fp8' or 'auto')."""
        if self.kv_cache_dtype != "auto" or not self.model_path:
            return self.kv_cache_dtype
        return checkpoint_kv_cache_dtype(self.model_path) or "auto"

    def spec(self) -> DeploymentSpec:
        """The device's view; `max_batch` is the sequence cap (a build limit for TensorRT-LLM,
        the compiled batch for Groq). A checkpoint `vllm serve` named without an FP8 KV-cache
        scheme keeps its KV cache in 16 bits, whatever its weights' format (as vLLM)."""
        kv = self.kv_cache_dtype
        if kv == "auto" and self.model_path:  # a checkpoint's: FP8 if declared, else 16 bits
            declared = checkpoint_kv_cache_dtype(self.model_path)  # None: not a checkpoint
            kv = {None: "auto", "auto": "bf16"}.get(declared, declared)
        return DeploymentSpec(
            model=self.model, quant=self.quant, chip=self.chip, engine=self.engine,
            count=self.count, tp=self.tp, pp=self.pp, ep=self.ep, n_gpu_layers=self.n_gpu_layers,
            built_for=self.built_for, max_context=self.max_model_len,
            max_batch=self.max_num_seqs or default_seqs(self) or 256,
            max_batched_tokens=self.max_num_batched_tokens, kv_cache_dtype=kv,
            speculative=SpeculativeConfig.parse(self.speculative_config),
            enforce_eager=self.enforce_eager, gpu_mem_utilisation=self.gpu_memory_utilization,
            kv_cache_memory_bytes=self.kv_cache_memory_bytes,
            cpu_offload_bytes=int(self.cpu_offload_gb * 2**30),
            convert=(served := self.conversion()).task, num_labels=served.num_labels,
        )
