"""What the supervisor's forkserver imports once, so every engine and front-end process it
forks starts with these modules (and the tokenizer) already loaded and shared copy-on-write.
Importing has no side effects beyond loading: no thread, socket or gRPC object is created."""

import os

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # the tokenizer is used after fork

import server.app
import server.engine_proc.main
import server.frontend.main  # noqa: F401
from server.engine.tokenizer import get_tokenizer

get_tokenizer()
