"""Numeric formats: element ladders, MX block casts (OCP / TFS / UOS rules), NVFP4."""

from mxattention.formats.ladders import E2M1, E2M3, E3M2, E4M3, E5M2, LADDERS, ElementLadder, get_ladder

__all__ = ["E2M1", "E2M3", "E3M2", "E4M3", "E5M2", "LADDERS", "ElementLadder", "get_ladder"]
