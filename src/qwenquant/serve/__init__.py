"""Serving an artifact with vLLM: argv (pure), memory plan (pure), discovery, preflight, supervisor."""
