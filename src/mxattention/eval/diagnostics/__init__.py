"""The paper's mechanism diagnostics. Some MATERIALIZE the attention matrix P (row-sum study):
they say so and process it in row chunks; they are for study, never for inference.

- `rowsum_study`  (Figure 7): row sums of a directly quantized P, the error split, entropy bins,
  and the global pre-quant scaling baseline.
- `q_sweep`       (Table 4): per-tensor MSE-optimal boundary q over 6.00..8.00.
- `method_errors` / `ablation`: attention-output error of methods against `fp`.
"""

from mxattention.eval.diagnostics.errors import ErrorRow, ablation, method_errors, output_error
from mxattention.eval.diagnostics.qsweep import QSweep, q_grid, q_sweep, sweep_histogram
from mxattention.eval.diagnostics.rowsum import RowSumStudy, rowsum_study

__all__ = [
    "ErrorRow",
    "QSweep",
    "RowSumStudy",
    "ablation",
    "method_errors",
    "output_error",
    "q_grid",
    "q_sweep",
    "rowsum_study",
    "sweep_histogram",
]
