"""What no stage teaches: model resolution and weight loading, tokenizer and chat template,
sampling, workload generators and the benchmark harness. Every stage imports these unchanged."""
