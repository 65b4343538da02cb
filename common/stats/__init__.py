"""The statistics that turn released sums into estimates, intervals and a verdict (design
§4.8, §5.9-§5.10 and §8.4): the multinomial bucket bootstrap, rows into buckets and the
replicates' counts (`bootstrap`), the misclassification correction and its noise threshold
(`correction`), the second moments a noised release is finished from (`moments`), and the
audit's result with its bootstrap or random-group intervals, differences, verdict and wire
form (`results`). It works on plain numbers the parties hand it and does no cryptography,
no I/O and no protocol step: the modules of this package import nothing of the project but
`common.errors`, each other, the Student t quantile of `common.metrics.scoring` and (for
`AuditReport.to_proto` only) the generated `proto.ppre_pb2` envelope; never the protocol's
messages or sessions (`common.protocol`), the network (`common.net`), the executors, the
cryptography or a party, a rule that tests/test_layering.py holds.
"""
