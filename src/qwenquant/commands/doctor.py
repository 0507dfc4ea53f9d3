"""`qwenquant doctor`: the versions qwenquant runs with and the vLLM `serve` would launch."""

from __future__ import annotations

import typer

from qwenquant.commands._app import app


@app.command()
def doctor(as_json: bool = typer.Option(False, "--json", help="Print the versions as JSON on stdout.")) -> None:
    """Print the versions of qwenquant, torch, transformers, llm-compressor, compressed-tensors and
    the vLLM that `qwenquant serve` would launch (read from .venv-vllm/qwenquant-vllm.json).

    Same as `qwenquant --version --verbose`.

    Examples:

      qwenquant doctor

      qwenquant doctor --json | jq .vllm
    """
    if as_json:
        from qwenquant.console import print_json
        from qwenquant.versions import doctor_dict

        print_json(doctor_dict())
        return
    from qwenquant.versions import version_lines

    print("\n".join(version_lines(True)))
