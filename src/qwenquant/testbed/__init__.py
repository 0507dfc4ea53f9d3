"""The pipeline's test bed, shipped for the demo: deterministic tiny Qwen3.5 checkpoints (tiny/,
the trained tiny reference included) and a loopback Hugging Face Hub server (hubserver/)."""
