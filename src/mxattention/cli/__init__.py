"""Command-line interface: `mxattention <subcommand>` (also `python -m mxattention`).

`main.main(argv)` is the entry point; each subcommand lives in its own module exposing
`add_arguments(parser)` and `run(args) -> int` (its docstring is the command's description),
registered with its name and help line in `main.COMMANDS` and imported only when named.
"""
