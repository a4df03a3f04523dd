"""Every engine, each stage and final/: conformance with HF transformers, the command-line rules, the samplers."""
