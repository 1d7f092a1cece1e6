"""`python3 -m tensorrt_llm.commands.serve MODEL --grpc ...` (smg's TensorRT-LLM launcher) is
`doppelchip trtllm-serve MODEL --grpc ...` (deploy/shims/README.md); every argument is passed
on, so without --grpc it is trtllm-serve's OpenAI HTTP server, as there.

The guard matters: the server's worker processes start by re-importing the main module by its
name, which must then not start another server."""

import sys

if __name__ == "__main__":
    from doppelchip.cli import main

    sys.exit(main(["trtllm-serve", *sys.argv[1:]]))
