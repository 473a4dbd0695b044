"""Statistics for comparing timings, in pure Python (no scipy): Student's t distribution
(its two-sided tail through the regularized incomplete beta function, and its quantiles by
bisection), Welch's t-test of two samples, and the 95% confidence interval of a mean.
`compare` tests a gap against run-to-run noise with them; `results` puts an interval
around repeats of one plan."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

ALPHA = 0.05
"""Two-sided level of the noise test: a 95% confidence interval of the difference."""


# --- Student's t distribution ----------------------------------------------------------------

def _beta_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function (modified Lentz's method)."""
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 500):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-14:
            break
    return h


def incomplete_beta(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b), for a, b > 0 and 0 <= x <= 1."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = (math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
                 + a * math.log(x) + b * math.log1p(-x))
    # The fraction converges fast only on one side of the mean; the other side by symmetry.
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _beta_fraction(a, b, x) / a
    return 1.0 - math.exp(log_front) * _beta_fraction(b, a, 1.0 - x) / b


def t_two_sided_p(t: float, dof: float) -> float:
    """P(|T| >= |t|) for Student's t with dof (possibly fractional) degrees of freedom."""
    if dof <= 0:
        raise ValueError(f"degrees of freedom {dof} must be positive")
    if math.isinf(t):
        return 0.0
    return incomplete_beta(dof / 2.0, 0.5, dof / (dof + t * t))


def t_quantile(p_two_sided: float, dof: float) -> float:
    """The t > 0 with P(|T| >= t) = p_two_sided (t_{0.975, dof} for p = 0.05), by bisection."""
    if not 0.0 < p_two_sided < 1.0:
        raise ValueError(f"p {p_two_sided} must lie strictly between 0 and 1")
    low, high = 0.0, 1.0
    while t_two_sided_p(high, dof) > p_two_sided:
        high *= 2.0
    for _ in range(200):
        mid = (low + high) / 2.0
        if t_two_sided_p(mid, dof) > p_two_sided:
            low = mid
        else:
            high = mid
        if high - low < 1e-12 * max(1.0, high):
            break
    return (low + high) / 2.0


@dataclass
class NoiseTest:
    """Welch's t-test of mean(b) - mean(a)."""

    n_a: int
    n_b: int
    mean_a: float
    mean_b: float
    diff: float | None = None
    t: float | None = None
    dof: float | None = None
    p: float | None = None
    ci95_low: float | None = None
    ci95_high: float | None = None
    """95% confidence interval of mean(b) - mean(a)."""
    outside_noise: bool | None = None
    reason: str = ""
    """Why no test was possible (fewer than two values on a side)."""

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def welch_test(a: list[float], b: list[float], alpha: float = ALPHA) -> NoiseTest:
    """Welch's unequal-variance t-test with Welch-Satterthwaite degrees of freedom."""
    a = [x for x in a if x is not None and math.isfinite(x)]
    b = [x for x in b if x is not None and math.isfinite(x)]
    if not a or not b:
        return NoiseTest(len(a), len(b), math.nan, math.nan, reason="no values on a side")
    mean_a, mean_b = statistics.fmean(a), statistics.fmean(b)
    test = NoiseTest(len(a), len(b), mean_a, mean_b, diff=mean_b - mean_a)
    if len(a) < 2 or len(b) < 2:
        test.reason = (f"{min(len(a), len(b))} value(s) on a side: at least 2 per side "
                       "are needed to estimate the noise")
        return test
    se2_a, se2_b = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    se2 = se2_a + se2_b
    if se2 == 0.0:
        # No spread at all on either side: any difference is outside it.
        test.outside_noise = test.diff != 0.0
        test.p = 0.0 if test.outside_noise else 1.0
        test.ci95_low = test.ci95_high = test.diff
        test.reason = "no spread on either side"
        return test
    test.t = test.diff / math.sqrt(se2)
    test.dof = se2 ** 2 / (se2_a ** 2 / (len(a) - 1) + se2_b ** 2 / (len(b) - 1))
    test.p = t_two_sided_p(test.t, test.dof)
    half = t_quantile(alpha, test.dof) * math.sqrt(se2)
    test.ci95_low, test.ci95_high = test.diff - half, test.diff + half
    test.outside_noise = test.p < alpha
    return test


def t_quantile_975(dof: int) -> float:
    """t_{0.975, dof}: the half-width factor of a two-sided 95% interval (12.706 at 1 degree
    of freedom, 4.303 at 2, 1.960 in the limit)."""
    if dof < 1:
        raise ValueError(f"degrees of freedom {dof} must be at least 1")
    return t_quantile(0.05, dof)


@dataclass
class Interval:
    """n values: mean, sample standard deviation (n-1) and the 95% confidence interval of
    the mean (Student t, n-1 degrees of freedom); no interval for a single value."""

    n: int
    mean: float
    std: float | None
    low: float | None
    high: float | None

    def to_dict(self) -> dict:
        return {"n": self.n, "mean": self.mean, "std": self.std, "ci95_low": self.low,
                "ci95_high": self.high}


def interval(values: list[float]) -> Interval | None:
    values = [v for v in values if v is not None and math.isfinite(v)]
    if not values:
        return None
    mean = statistics.fmean(values)
    if len(values) == 1:
        return Interval(1, mean, None, None, None)
    std = statistics.stdev(values)
    half = t_quantile_975(len(values) - 1) * std / math.sqrt(len(values))
    return Interval(len(values), mean, std, mean - half, mean + half)
