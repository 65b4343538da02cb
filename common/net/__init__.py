"""The network layer (design §1.2 and §3.8, docs/architecture.md "What crosses the
wire"): where gRPC servers and channels are built with their credentials, keepalive and
message cap (`channels`), mutual TLS with the allow-listed identities per role and the
development CA (`tls`), the movement of PeerMessages between a gRPC stream and a
session, with heartbeats, peer deadlines and bounded queues (`peer_stream`), and a
service's session limit and shutdown (`admission`). It carries messages and knows who
sent them; what they mean is the message layer's (`common.protocol`), which it sits on:
the modules of this package import nothing of the project but `common.errors`, each
other, `common.protocol` (the message cap and the parsing of `wire`, the heartbeat check
of `validation`) and the generated `proto.ppre_pb2` messages; never the statistics, the
metrics, the cryptography, the executors or a party, and the message layer never
imports it back, a rule that tests/test_layering.py holds.
"""
