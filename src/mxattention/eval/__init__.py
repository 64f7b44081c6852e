"""Evaluation: real pretrained models driven through any SDPA-compatible attention, metrics, reports."""
