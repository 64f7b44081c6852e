"""Evaluation: diagnostics of the quantization mechanisms, real-model harnesses, quality reports."""
