"""Command-line interface: `mxattention <subcommand>` (also `python -m mxattention`).

`main.main(argv)` is the entry point; each subcommand lives in its own module exposing
`NAME`, `HELP`, `add_arguments(parser)` and `run(args) -> int`, registered in `main.SUBCOMMANDS`.
"""
