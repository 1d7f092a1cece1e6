"""The docs checker (issue 15): every shell command in README.md and docs/*.md is run or marked.

`blocks` reads the fenced blocks, `commands` splits a shell block into commands and rewrites
ports and servers, `runner` executes a block against loopback servers, `outputs` compares and
regenerates quoted outputs. The convention is in docs/DOCS_TESTS.md.
"""
