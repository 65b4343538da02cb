"""The protocol's message layer, what both parties' sans-I/O sessions share (design §3.8
and §3.9): the chunking of every table into TableChunk messages and its reassembly
(`wire`), each party's phases and its one table of transitions, which is also what each
phase accepts (`transitions`), the one gate every received PeerMessage passes, with a
validator per kind (`validation`), and the base class, timings and chunk checkpoints of
the sessions (`session`). The four form one package because they are one layer:
`validation` checks chunks with `wire`, admits a kind by `transitions`' table and
refuses a message at the wrong moment with `session`'s `PhaseError`, and the parties'
state machines (`tester_service.protocol`, `client_service.protocol`) use all four;
none of them does I/O, so they sit below the network (`common.net`), which carries
what they build and check. To check content
against the audit, the modules of this package import nothing of the project but
`common.errors`, each other, `common.logs` (the audit id), the cryptography (point and
ciphertext checks, sealed widths), the metrics (layouts, second moments), the statistics
(the correction methods a Hello may name) and the generated `proto.ppre_pb2` messages;
never the network, the executors, the tables reader or a party, a rule that
tests/test_layering.py holds.
"""
