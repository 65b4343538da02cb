"""The statistics that turn released sums into estimates, intervals and a verdict (design
§4.8, §5.9-§5.10 and §8.4): the multinomial bucket bootstrap, rows into buckets and the
replicates' counts (`bootstrap`), the misclassification correction and its noise threshold
(`correction`), the second moments a noised release is finished from (`moments`),
Student's t quantile (`quantiles`), the intervals, ranges and detectable differences
(`intervals`), the groups left out of a verdict for their size (`left_out`), the verdict
and its rules (`verdict`), the verdict's sentences and the reports' summaries (`wording`),
and the audit's result with its differences and wire form (`results`). It works on plain
numbers the parties hand it and does no cryptography, no I/O and no protocol step: the
modules of this package import nothing of the project but `common.errors`, each other and
(for `AuditReport.to_proto` only) the generated `proto.ppre_pb2` envelope; never a metric
(`common.metrics` builds on this package, not the other way), the protocol's messages or
sessions (`common.protocol`), the network (`common.net`), the executors, the cryptography
or a party, a rule that tests/test_layering.py holds.
"""
