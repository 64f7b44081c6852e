"""Why 7.25: the Universal-Optimal-Scaling theory of docs/design.md, 'Universal Optimal Scaling', for any element ladder.

Modules, one job each:

- `error`: E(x), D(x) = E(x)/x^3 and Delta(q) = E(q) - 8 E(q/2), in float64 and exactly (Fraction);
- `densities`: phase densities H of log2(M) mod 1 and g(x) = H(log2 x)/(x ln 2);
- `objective`: J(q) = integral_{q/2}^{q} D g, its derivative, and the brute-force grid minimizer;
- `boundary`: the exact root q* of Delta (`optimal_boundary`, 29/4 for E2M1);
- `rules`: normalized-max ranges, overflow probabilities and the OCP / TFS / UOS rule table.

Depends on numpy and `mxattention.formats.ladders` only.
"""

from mxattention.theory.boundary import QuadraticRoot, optimal_boundary, optimal_boundary_exact
from mxattention.theory.densities import (
    Harmonic,
    LogUniform,
    Mixture,
    PhaseDensity,
    WrappedNormal,
    figure_densities,
    g,
)
from mxattention.theory.error import D, D_exact, Delta, Delta_exact, E, E_exact, error_knots
from mxattention.theory.objective import J, J_prime, brute_force_boundary, default_grid
from mxattention.theory.rules import (
    RULE_NAMES,
    Interval,
    RuleRow,
    normalized_max_range,
    ocp_overflow_probability,
    overflow_interval,
    overflow_probability,
    overflow_threshold,
    rule_table,
)

__all__ = [
    "RULE_NAMES",
    "D",
    "D_exact",
    "Delta",
    "Delta_exact",
    "E",
    "E_exact",
    "Harmonic",
    "Interval",
    "J",
    "J_prime",
    "LogUniform",
    "Mixture",
    "PhaseDensity",
    "QuadraticRoot",
    "RuleRow",
    "WrappedNormal",
    "brute_force_boundary",
    "default_grid",
    "error_knots",
    "figure_densities",
    "g",
    "normalized_max_range",
    "ocp_overflow_probability",
    "optimal_boundary",
    "optimal_boundary_exact",
    "overflow_interval",
    "overflow_probability",
    "overflow_threshold",
    "rule_table",
]
