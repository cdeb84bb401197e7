"""Metrics and data sets that the export gates, training and perf measure with: word error
rate, speech clips (synthesised and human), sentence sets, the lipsync labels and scores,
the INT8 gates' verdicts (evals.gate and each stage's module: the export builds a variant and
asks for its verdict), and where results are written. Imports only the runtime core
(`avatar`)."""
