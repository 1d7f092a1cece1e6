"""The `[server]` table of a fleet file: the server's own settings (ports, time scale, drain,
the HTTP and gRPC APIs a pod imitates, security and listener limits), and the check of the
ones that must agree with each other (`server_problem`), run again once the command line's
flags are applied.

Why a module of its own: the server's settings are read by the listeners (`server/grpc_server.py`,
`server/http/server.py`) and the manifests' generators without the deployments' parsing
(`server/config.py`).
"""

from __future__ import annotations

from dataclasses import dataclass

from server.engine.profiler_config import ProfilerConfig


@dataclass(frozen=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 50051
    http_port: int = 8000  # OpenAI HTTP + /metrics, as vLLM's --port ("metrics_port": alias)
    default_deployment: str = ""
    time_scale: float = 1.0
    drain_grace_s: float = 10.0
    event_loop: str = "auto"
    vllm_engine_deployment: str = ""  # the deployment VllmEngine fronts ("": the default one)
    api_server_count: int = 0  # front-end processes (vLLM's --api-server-count); 0: auto
    stream_interval: int = 1  # vLLM's --stream-interval: tokens per streamed message
    engine_restart_backoff_s: float = 2.0
    # vLLM's --show-hidden-metrics-for-version: "0.10" also exports vLLM 0.11.x's deprecated
    # names (vllm:gpu_cache_usage_perc, vllm:gpu_prefix_cache_*), as 0.11.x did
    show_hidden_metrics_for_version: str = ""
    # vLLM's --enable-server-load-tracking: GET /load counts this front end's requests in flight
    enable_server_load_tracking: bool = False
    # vLLM's --enable-scale-out: the render and token-in/token-out routes (403 without it)
    enable_scale_out: bool = False
    # vLLM's --custom-histogram-buckets: JSON {family: [bounds]} replacing the bounds of the vllm:
    # histograms of a family (server/stats/buckets.py, which `serve` checks it with); in a
    # fleet file also a table
    custom_histogram_buckets: str = ""
    # vLLM's --enable-auto-tool-choice and --tool-call-parser: accepted (tool calls need neither
    # here); with a parser, vllm:tool_call_parser_invocations_total is exported
    enable_auto_tool_choice: bool = False
    tool_call_parser: str = ""
    # vLLM's --enable-tokenizer-info-endpoint: GET /tokenizer_info (404 without it)
    enable_tokenizer_info_endpoint: bool = False
    # vLLM's --enable-force-include-usage: every stream carries its usage (chunks and a last one)
    enable_force_include_usage: bool = False
    # vLLM's --disable-log-stats: no stat loggers, so /metrics has none of the engine's and
    # requests' vllm: series (doppelchip's own, the HTTP and process series stay)
    disable_log_stats: bool = False
    # vLLM's --enable-per-request-metrics: completions and chat answers (one prompt, n = 1)
    # carry their emulated timings as `metrics` (server/http/per_request_metrics.py)
    enable_per_request_metrics: bool = False
    # vLLM's --response-role: a chat answer's role when the request adds a generation prompt
    response_role: str = "assistant"
    # vLLM's --return-tokens-as-token-ids: logprobs name tokens "token_id:N" unless a request
    # says otherwise (its own return_tokens_as_token_ids)
    return_tokens_as_token_ids: bool = False
    # vLLM's --profiler-config: JSON; with profiler "torch", /start_profile and /stop_profile
    # write each engine core's emulated steps as a trace (server/engine/profiler_config.py)
    profiler_config: str = ""
    # One deployment per pod (`serve --deployment`/catalogue flags): the vllm: series carry
    # vLLM's own labels only (model_name, engine), no `deployment` label, as a vLLM pod's
    pod: bool = False
    # The server a pod imitates: "vllm" (vLLM's OpenAI server; VllmEngine on the gRPC port) or
    # "sglang" (SGLang's server: /generate, /model_info, /server_info, /v1/loads,
    # /flush_cache, sglang: metrics, server/http/sglang/; SglangScheduler on the gRPC port,
    # server/sglang_servicer.py; docs/SGLANG.md) or "trtllm" (trtllm-serve's OpenAI server:
    # /health, /version, iteration stats on /metrics, trtllm_ series on /prometheus/metrics,
    # server/http/trtllm/; TrtllmService on the gRPC port; docs/TRTLLM.md). "sglang" and
    # "trtllm" need pod mode: one model.
    http_api: str = "vllm"
    # The engine service on the gRPC port beside Inference (what smg in gRPC mode detects):
    # "" follows http_api (VllmEngine on a vLLM pod, SglangScheduler on an SGLang pod);
    # "trtllm": TensorRT-LLM's TrtllmService (`trtllm-serve --grpc`, server/trtllm_servicer.py;
    # docs/TRTLLM.md), or "mlx": MLX's MlxEngine (smg's MLX servicer, server/mlx_servicer.py;
    # docs/MLX.md), on a vLLM-API pod in pod mode.
    grpc_api: str = ""
    # SGLang's --enable-metrics: /metrics (sglang: series) on an SGLang pod; without it SGLang
    # mounts no /metrics. On a TensorRT-LLM pod, its return_perf_metrics and
    # enable_iter_perf_stats: /prometheus/metrics (trtllm_ series) and the iteration stats of
    # /metrics. (A vLLM pod always exports its metrics.)
    enable_metrics: bool = False
    # ---- security (vLLM's flags; all off by default: loopback) -----------------------------
    api_key: tuple[str, ...] = ()  # --api-key: Bearer keys, HTTP and gRPC (OPERATIONS.md)
    ssl_keyfile: str = ""  # TLS for both ports when ssl_keyfile and ssl_certfile are set
    ssl_certfile: str = ""
    ssl_ca_certs: str = ""  # CA bundle that client certificates are verified against
    ssl_cert_reqs: int = 0  # ssl.CERT_NONE 0 / CERT_OPTIONAL 1 / CERT_REQUIRED 2 (mTLS)
    # ---- listener limits (one gRPC server and one HTTP listener serve every deployment) ----
    grpc_max_receive_message_length: int = 4 * 1024 * 1024  # grpc's default, 4 MiB
    grpc_max_concurrent_streams: int = 0  # per HTTP/2 connection; 0: grpc's default (none)
    http_timeout_keep_alive_s: float = 5.0  # an idle HTTP connection closes (vLLM: 5 s)
    http_header_timeout_s: float = 10.0  # request line + headers must arrive within this
    h11_max_incomplete_event_size: int = 4 * 1024 * 1024  # request line + headers, bytes
    h11_max_header_count: int = 256  # headers per request (vLLM's flag and default)
    # vLLM's --sse-keep-alive-interval (0.34.0): a streamed completion or chat answer idle
    # this many wall seconds sends ": keep-alive" (server/http/sse_keep_alive.py); 0: never
    sse_keep_alive_interval: int = 0

    @property
    def tls(self) -> bool:
        """Both ports speak TLS (a key and a certificate are configured)."""
        return bool(self.ssl_keyfile and self.ssl_certfile)

    @property
    def engine_api(self) -> str:
        """Whose engine service the gRPC port serves: "vllm", "sglang", "trtllm" or "mlx"."""
        return self.grpc_api or self.http_api

    @property
    def metrics_port(self) -> int:
        """The permanent alias of `http_port` (/metrics is served on the HTTP port)."""
        return self.http_port


HTTP_APIS = ("vllm", "sglang", "trtllm")
GRPC_APIS = ("", "vllm", "sglang", "trtllm", "mlx")
# engine services a vLLM-API pod serves in VllmEngine's place (pod mode: one model)
POD_GRPC_APIS = ("trtllm", "mlx")


def server_problem(s: ServerConfig) -> str:
    """What is wrong with the security and listener settings ("" when nothing), checked again
    after the CLI flags are applied."""
    if bool(s.ssl_keyfile) != bool(s.ssl_certfile):
        return "ssl_keyfile and ssl_certfile go together (TLS needs a key and its certificate)"
    if s.ssl_cert_reqs not in (0, 1, 2):
        return ("ssl_cert_reqs must be 0 (ssl.CERT_NONE), 1 (CERT_OPTIONAL) or 2 "
                f"(CERT_REQUIRED), got {s.ssl_cert_reqs}")
    if (s.ssl_ca_certs or s.ssl_cert_reqs) and not s.tls:
        return "ssl_ca_certs and ssl_cert_reqs need TLS (ssl_keyfile and ssl_certfile)"
    if s.ssl_cert_reqs and not s.ssl_ca_certs:
        return "ssl_cert_reqs 1 or 2 needs ssl_ca_certs (the CA client certificates chain to)"
    if s.enable_per_request_metrics and s.disable_log_stats:  # vLLM's words
        return ("Error: --enable-per-request-metrics requires engine statistics logging; remove "
                "--disable-log-stats to enable per-request metrics.")
    if s.sse_keep_alive_interval < 0:  # vLLM's words (validate_parsed_serve_args)
        return ("Error: --sse-keep-alive-interval must be a non-negative integer (0 disables "
                "keep-alive comments).")
    for key in ("grpc_max_receive_message_length", "h11_max_incomplete_event_size",
                "h11_max_header_count"):
        if getattr(s, key) < 1:
            return f"{key} must be >= 1"
    try:
        ProfilerConfig.parse(s.profiler_config)
    except ValueError as e:
        return str(e)
    if s.http_api not in HTTP_APIS:
        return f"http_api must be one of {', '.join(HTTP_APIS)}, got {s.http_api!r}"
    if s.http_api != "vllm" and not s.pod:
        server = "an SGLang" if s.http_api == "sglang" else "a trtllm-serve"
        return (f"http_api {s.http_api!r} serves one deployment, as {server} server serves one "
                "model: use pod mode (--deployment NAME, or --chip --engine --model --quant)")
    if s.grpc_api not in GRPC_APIS:
        return f"grpc_api must be one of {', '.join(GRPC_APIS[1:])}, got {s.grpc_api!r}"
    if s.grpc_api not in ("", s.http_api) and not (s.grpc_api in POD_GRPC_APIS and s.pod
                                                   and s.http_api == "vllm"):
        return (f"grpc_api {s.grpc_api!r} with http_api {s.http_api!r}: an SGLang pod serves "
                "SglangScheduler, a TensorRT-LLM pod TrtllmService, a vLLM pod VllmEngine or "
                "(pod mode) TrtllmService or MlxEngine")
    if s.grpc_max_concurrent_streams < 0:
        return "grpc_max_concurrent_streams must be >= 0 (0: grpc's default)"
    for key in ("http_timeout_keep_alive_s", "http_header_timeout_s"):
        if not getattr(s, key) > 0:
            return f"{key} must be > 0"
    return ""
