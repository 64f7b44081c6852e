"""The package version, in a module of its own so that `mxattention --version` imports nothing else."""

__version__ = "1.0.0"
