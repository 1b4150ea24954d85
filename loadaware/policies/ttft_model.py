"""A per-endpoint TTFT model learned online from what the router sees: pure arithmetic, no clocks.

    ttft ~ base + per_token x tokens_ahead + per_running x running

tokens_ahead: uncached prompt tokens this router had sent to the endpoint and not yet seen prefilled, plus
the request's own uncached tokens, at the decision; running: the endpoint's load at the decision. Each
observation (a first response chunk) updates an exponentially weighted ridge regression: `decay` per
observation forgets the past (a fleet's speed changes), and a ridge pull towards `prior` keeps the fit sane
before it has seen enough (and when one feature never varies). Features are scaled (tokens / 1000,
running / 10) so one ridge strength suits all three coefficients.
"""

from __future__ import annotations

from dataclasses import dataclass, field

_TOKEN_SCALE = 1000.0
_RUNNING_SCALE = 10.0


@dataclass(frozen=True, slots=True)
class TtftPrior:
    base_s: float = 0.05
    per_token_s: float = 1 / 4000  # ~4k uncached tokens/s of prefill
    per_running_s: float = 0.0025  # a first token waits ~2 decode steps, each ~1.2 ms longer per sequence
    strength: float = 2.0  # weight of the prior, in observations
    decay: float = 0.98  # per observation: the fit remembers the last ~50

    def theta(self) -> tuple[float, float, float]:
        return (self.base_s, self.per_token_s * _TOKEN_SCALE, self.per_running_s * _RUNNING_SCALE)


def _solve3(a: list[list[float]], b: list[float]) -> tuple[float, float, float] | None:
    """Gaussian elimination with partial pivoting on a 3x3 system; None if singular."""
    m = [row[:] + [v] for row, v in zip(a, b)]
    for col in range(3):
        piv = max(range(col, 3), key=lambda r: abs(m[r][col]))
        if abs(m[piv][col]) < 1e-12:
            return None
        m[col], m[piv] = m[piv], m[col]
        for r in range(col + 1, 3):
            f = m[r][col] / m[col][col]
            for c in range(col, 4):
                m[r][c] -= f * m[col][c]
    x = [0.0, 0.0, 0.0]
    for r in (2, 1, 0):
        x[r] = (m[r][3] - sum(m[r][c] * x[c] for c in range(r + 1, 3))) / m[r][r]
    return x[0], x[1], x[2]


@dataclass
class TtftModel:
    prior: TtftPrior = field(default_factory=TtftPrior)
    observations: int = 0
    _xx: list[list[float]] = field(default_factory=lambda: [[0.0] * 3 for _ in range(3)], repr=False)
    _xy: list[float] = field(default_factory=lambda: [0.0] * 3, repr=False)
    _theta: tuple[float, float, float] | None = field(default=None, repr=False)

    def observe(self, tokens_ahead: float, running: float, ttft_s: float) -> None:
        if not (ttft_s >= 0 and tokens_ahead >= 0 and running >= 0):
            return  # NaN or nonsense: ignore, never poison the fit
        x = (1.0, tokens_ahead / _TOKEN_SCALE, running / _RUNNING_SCALE)
        d = self.prior.decay
        for i in range(3):
            self._xy[i] = d * self._xy[i] + x[i] * ttft_s
            row = self._xx[i]
            for j in range(3):
                row[j] = d * row[j] + x[i] * x[j]
        self.observations += 1
        self._theta = None

    def _fit(self) -> tuple[float, float, float]:
        if self._theta is None:
            lam, t0 = self.prior.strength, self.prior.theta()
            a = [[self._xx[i][j] + (lam if i == j else 0.0) for j in range(3)] for i in range(3)]
            b = [self._xy[i] + lam * t0[i] for i in range(3)]
            theta = _solve3(a, b) or t0
            # Time never runs backwards: a negative slope is noise, not physics.
            self._theta = (max(0.0, theta[0]), max(0.0, theta[1]), max(0.0, theta[2]))
        return self._theta

    @property
    def base_s(self) -> float:
        return self._fit()[0]

    @property
    def per_token_s(self) -> float:
        return self._fit()[1] / _TOKEN_SCALE

    @property
    def per_running_s(self) -> float:
        return self._fit()[2] / _RUNNING_SCALE

    def predict(self, tokens_ahead: float, running: float) -> float:
        return self.base_s + self.per_token_s * tokens_ahead + self.per_running_s * running
