"""A per-endpoint TTFT model learned online from what the router sees: pure arithmetic, no clocks.

    ttft ~ base + per_token x tokens_ahead + per_matched_token x matched_ahead + per_running x running

tokens_ahead: uncached prompt tokens this router had sent to the endpoint and not yet seen prefilled, plus
the request's own uncached tokens, at the decision; matched_ahead: the same for the prompt tokens the prefix
source said the endpoint held (a "held" token is not free when it sits in a slower tier, e.g. LMCache's CPU
store, and must be loaded: its learned price says how often and how dear); running: the endpoint's load at
the decision. Each observation (a first response chunk) updates an exponentially weighted ridge regression:
`decay` per observation forgets the past (a fleet's speed changes), and a ridge pull towards `prior` keeps
the fit sane before it has seen enough (and when one feature never varies). Features are scaled (tokens /
1000, running / 10) so one ridge strength suits every coefficient.

The fit (a 4x4 solve) is made when the prices are read, and then again only once REFIT_EVERY more
observations have come (every one of the first REFIT_EVERY): a router reading prices on every decision of a
busy endpoint would otherwise solve once per first chunk, while one observation moves a fit that remembers ~50
by about 2%.
"""

from __future__ import annotations

from dataclasses import dataclass, field

_TOKEN_SCALE = 1000.0
_RUNNING_SCALE = 10.0
_N = 4  # features: 1, tokens_ahead, matched_ahead, running
REFIT_EVERY = 8

Prices = tuple[float, float, float]  # (base_s, per_token_s, per_running_s): what a TTFT cost is priced with


@dataclass(frozen=True, slots=True)
class TtftPrior:
    base_s: float = 0.05
    per_token_s: float = 1 / 4000  # ~4k uncached tokens/s of prefill
    per_running_s: float = 0.0025  # a first token waits ~2 decode steps, each ~1.2 ms longer per sequence
    per_matched_token_s: float = 0.0  # a held token is free until the engine shows otherwise
    strength: float = 2.0  # weight of the prior, in observations
    decay: float = 0.98  # per observation: the fit remembers the last ~50

    def prices(self) -> Prices:
        return self.base_s, self.per_token_s, self.per_running_s

    def theta(self) -> tuple[float, ...]:
        return (self.base_s, self.per_token_s * _TOKEN_SCALE, self.per_matched_token_s * _TOKEN_SCALE,
                self.per_running_s * _RUNNING_SCALE)


def _solve(a: list[list[float]], b: list[float]) -> list[float] | None:
    """Gaussian elimination with partial pivoting on a small square system; None if singular."""
    n = len(b)
    m = [row[:] + [v] for row, v in zip(a, b)]
    for col in range(n):
        piv = max(range(col, n), key=lambda r: abs(m[r][col]))
        if abs(m[piv][col]) < 1e-12:
            return None
        m[col], m[piv] = m[piv], m[col]
        for r in range(col + 1, n):
            f = m[r][col] / m[col][col]
            for c in range(col, n + 1):
                m[r][c] -= f * m[col][c]
    x = [0.0] * n
    for r in range(n - 1, -1, -1):
        x[r] = (m[r][n] - sum(m[r][c] * x[c] for c in range(r + 1, n))) / m[r][r]
    return x


@dataclass
class TtftModel:
    prior: TtftPrior = field(default_factory=TtftPrior)
    observations: int = 0
    _xx: list[list[float]] = field(default_factory=lambda: [[0.0] * _N for _ in range(_N)], repr=False)
    _xy: list[float] = field(default_factory=lambda: [0.0] * _N, repr=False)
    _theta: tuple[float, ...] | None = field(default=None, repr=False)
    _fitted_at: int = field(default=0, repr=False)  # observations when _theta was fitted

    def observe(self, tokens_ahead: float, running: float, ttft_s: float, matched_ahead: float = 0.0) -> None:
        if not (ttft_s >= 0 and tokens_ahead >= 0 and running >= 0 and matched_ahead >= 0):
            return  # NaN or nonsense: ignore, never poison the fit
        x = (1.0, tokens_ahead / _TOKEN_SCALE, matched_ahead / _TOKEN_SCALE, running / _RUNNING_SCALE)
        d = self.prior.decay
        for i in range(_N):
            self._xy[i] = d * self._xy[i] + x[i] * ttft_s
            row = self._xx[i]
            for j in range(_N):
                row[j] = d * row[j] + x[i] * x[j]
        self.observations += 1

    def _fit(self) -> tuple[float, ...]:
        n = self.observations
        if self._theta is None or n - self._fitted_at >= (1 if n <= REFIT_EVERY else REFIT_EVERY):
            self._fitted_at = n
            lam, t0 = self.prior.strength, self.prior.theta()
            a = [[self._xx[i][j] + (lam if i == j else 0.0) for j in range(_N)] for i in range(_N)]
            b = [self._xy[i] + lam * t0[i] for i in range(_N)]
            theta = _solve(a, b) or list(t0)
            # Time never runs backwards: a negative slope is noise, not physics.
            self._theta = tuple(max(0.0, v) for v in theta)
        return self._theta

    def prices(self) -> tuple[float, float, float, float]:
        """(base_s, per_token_s, per_matched_token_s, per_running_s) from one fit: what a candidate copies."""
        t = self._fit()
        return t[0], t[1] / _TOKEN_SCALE, t[2] / _TOKEN_SCALE, t[3] / _RUNNING_SCALE

    @property
    def base_s(self) -> float:
        return self._fit()[0]

    @property
    def per_token_s(self) -> float:
        return self._fit()[1] / _TOKEN_SCALE

    @property
    def per_matched_token_s(self) -> float:
        return self._fit()[2] / _TOKEN_SCALE

    @property
    def per_running_s(self) -> float:
        return self._fit()[3] / _RUNNING_SCALE

    def predict(self, tokens_ahead: float, running: float, matched_ahead: float = 0.0) -> float:
        return (self.base_s + self.per_token_s * tokens_ahead + self.per_matched_token_s * matched_ahead
                + self.per_running_s * running)
