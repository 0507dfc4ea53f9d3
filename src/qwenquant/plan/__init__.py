"""Memory planning for serving (pure): weight bytes by component, KV cache, GDN state and
activations against a GPU's budget, per serve profile; `--gpu-mem` arithmetic; renderings."""
