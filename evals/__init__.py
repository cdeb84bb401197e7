"""Metrics and data sets that the export gates, training and perf measure with: word error
rate, speech clips (synthesised and human), sentence sets, the lipsync labels and scores,
and where results are written. Imports only the runtime core (`avatar`)."""
