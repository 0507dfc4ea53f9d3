"""`python -m qwenquant.vllmcompat`: print the README's vLLM version tables (paste between the markers)."""

from qwenquant.vllmcompat.render import markdown

print(markdown(), end="")
