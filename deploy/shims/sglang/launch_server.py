"""`python3 -m sglang.launch_server ...` is `doppelchip sglang serve ...` (deploy/shims/README.md).

The guard matters: the server's worker processes start by re-importing the main module by its
name, which must then not start another server."""

import sys

if __name__ == "__main__":
    from doppelchip.cli import main

    sys.exit(main(["sglang", "serve", *sys.argv[1:]]))
