"""python -m final [--model PATH] [--shell] ...  (python -m final --help lists every flag)"""

from __future__ import annotations

from .args import parse_args
from .core.errors import run_cli


def main(argv: list[str] | None = None) -> int:
    command = parse_args(argv)  # a bad engine flag fails here, before anything starts
    config, options = command.engine, command.options
    if config.node_rank > 0:  # another node of a multi-node --tp: start its ranks for node 0
        from .core.logs import setup_logging
        from .runtime.node import serve_node

        setup_logging(options.log_level or "info")
        return serve_node(config)
    if options.shell:
        from .shell import run_shell

        return run_shell(options, config)
    from .server import serve

    return serve(options, config)


if __name__ == "__main__":
    run_cli(main)
