"""Inter-process plumbing: the messages between front ends, engine cores and the supervisor
(`messages`), their encoding, and where the sockets and shared files live (`paths`)."""
