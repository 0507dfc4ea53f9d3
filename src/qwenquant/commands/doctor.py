"""`qwenquant doctor`: the versions qwenquant runs with and the vLLM `serve` would launch."""

from __future__ import annotations

from qwenquant.commands._app import app


@app.command()
def doctor() -> None:
    """Print the versions of qwenquant, torch, transformers, llm-compressor, compressed-tensors and
    the vLLM that `qwenquant serve` would launch (read from .venv-vllm/qwenquant-vllm.json).

    Same as `qwenquant --version --verbose`.

    Examples:

      qwenquant doctor
    """
    from qwenquant.versions import version_lines

    print("\n".join(version_lines(True)))
