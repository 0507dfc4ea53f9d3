"""CLI command modules. Each registers its commands on the shared typer app.

Only light imports at module level: `qwenquant --help` must not load torch, transformers or
llm-compressor. Heavy modules are imported inside the command body.
"""
