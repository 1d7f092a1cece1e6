"""How many calls grpc's C core may hold before the Python server has taken them.

Why this exists: grpc.aio takes calls from the core one at a time, on the event loop. Calls
that arrive faster wait in the core's pending queue, and the core protects that queue by
random early detection between `grpc.server.max_pending_requests` (default 1,000) and
`grpc.server.max_pending_requests_hard_limit` (default 3,000): a call it drops never reaches a
handler, and on the chttp2 (filter-stack) path the client sees CANCELLED with the detail
"CANCELLED" and nothing else — about 22% of a burst of 3,000 concurrent Generate calls on one
connection (issue 14 #5). Overload must be answered by admission control instead
(RESOURCE_EXHAUSTED with the deployment and its `max_waiting`), so the pending queue is made
deep enough for any burst the loop can take in: each pending call costs the core a few KB
(its headers and request message), and calls still waiting after
`grpc.server_max_unrequested_time_in_server` (30 s) are dropped as before.
"""

from __future__ import annotations

MAX_PENDING_CALLS = 20_000

BACKLOG_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.server.max_pending_requests", MAX_PENDING_CALLS),
    ("grpc.server.max_pending_requests_hard_limit", MAX_PENDING_CALLS),
)
