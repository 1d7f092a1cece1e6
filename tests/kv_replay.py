"""What KV-event tests share: every batch a publisher's replay socket still holds.

vLLM's replay protocol, as smg's relay asks for a gap (its `replay_frames`): a DEALER sends
`[b"", start]`; each answer's last two frames are the sequence and the payload (after the
topic for vLLM, without it for SGLang); the end marker is sequence -1."""

from __future__ import annotations

import zmq

END = (-1).to_bytes(8, "big", signed=True)


def replayed(endpoint: str, start: int = 0, frames: int | None = None
             ) -> list[tuple[int, bytes]]:
    """(sequence, payload) of every batch the publisher at `endpoint` holds from `start` on;
    `frames`: how many frames each answer must have (3 for SGLang's `[b"", seq, payload]`,
    4 for vLLM's, which adds the topic)."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    sock.send_multipart((b"", start.to_bytes(8, "big")))
    out = []
    try:
        while True:
            assert sock.poll(10_000), "the replay did not answer"
            answer = sock.recv_multipart()
            assert frames is None or len(answer) == frames, answer
            seq, payload = answer[-2:]
            if seq == END:
                return out
            out.append((int.from_bytes(seq, "big"), payload))
    finally:
        sock.close(linger=0)
        ctx.term()
