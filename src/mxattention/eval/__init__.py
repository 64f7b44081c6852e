"""Evaluation: mechanism diagnostics, real-model harnesses (MiniLM, terrain diffusion), quality reports."""
