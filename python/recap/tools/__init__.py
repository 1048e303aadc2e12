"""What the command line runs: the CLI, the benchmarks, the shipped prompts and the embedded
default model."""
