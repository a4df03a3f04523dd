"""python -m final [--model PATH] [--shell] ...  (python -m final --help lists every flag)"""

from __future__ import annotations

from .args import engine_config_from_args, parse_args
from .core.errors import run_cli


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    config = engine_config_from_args(args)  # a bad engine flag fails here, before anything starts
    if config.node_rank > 0:  # another node of a multi-node --tp: start its ranks for node 0
        from .core.logs import setup_logging
        from .engine.ranks import serve_node

        setup_logging(args.log_level or "info")
        return serve_node(config)
    if args.shell:
        from .shell import run_shell

        return run_shell(args, config)
    from .server import serve

    return serve(args, config)


if __name__ == "__main__":
    run_cli(main)
