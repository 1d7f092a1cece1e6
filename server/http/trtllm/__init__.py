"""A TensorRT-LLM pod's HTTP server (`--http-api trtllm`): trtllm-serve's OpenAI server."""
