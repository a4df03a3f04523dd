"""stages/common: the workloads, the bench harness, the detokenizer."""
