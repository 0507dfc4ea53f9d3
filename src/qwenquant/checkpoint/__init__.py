"""Safetensors checkpoints: read headers (header.py), read and write raw tensors (tensorfile.py),
derive one checkpoint folder from another (assemble.py), compare tensors byte for byte (identity.py).

Nothing here decodes a tensor: bytes move between checkpoints unchanged unless a stage replaces them.
"""
