"""The JetStream side of Motor: server, connection, streams, publish, read/follow, checkpoints."""
