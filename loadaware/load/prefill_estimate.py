"""An engine's mean time to first token, learned from its own TTFT histogram as the scraper reads it: what
BUFFERED mode (no response bodies, so no first chunk to see) uses to say when a request's prefill is done.

    sample(i)    = delta vllm:time_to_first_token_seconds_sum / delta ..._count   between two scrapes of i
    mean_ttft(i) = mean_ttft(i) + w x (sample(i) - mean_ttft(i)),  w = delta count / (delta count + PRIOR_REQUESTS)

The weight grows with the requests behind the sample: an interval with one first token moves the mean a
little, one with dozens nearly replaces it. A counter going backwards (the engine restarted) starts over.
The signal tracker (signals.py) retires a request's uncached tokens from its engine's prefill queue
mean_ttft(i) after the decision: by Little's law (mean queue = arrival rate x mean wait) the queue's time
average is then right when the mean is; what it misses is each request's own deviation from the mean.
Pure: no clocks, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

PRIOR_REQUESTS = 8.0  # first tokens a sample needs to weigh as much as the mean it updates


@dataclass(slots=True)
class TtftFromCounters:
    """One engine's mean TTFT (seconds) from consecutive readings of its TTFT histogram's sum and count."""

    mean_s: float | None = None  # None until two readings with first tokens between them
    _sum: float = 0.0
    _count: float = 0.0
    _read: bool = False

    def scraped(self, ttft_sum: float | None, ttft_count: float | None) -> None:
        """One scrape's running totals (None: the engine does not export the histogram)."""
        if ttft_sum is None or ttft_count is None:
            return
        if self._read and ttft_count >= self._count and ttft_sum >= self._sum:
            new = ttft_count - self._count
            if new > 0:
                sample = (ttft_sum - self._sum) / new
                mean = self.mean_s
                self.mean_s = sample if mean is None else mean + new / (new + PRIOR_REQUESTS) * (sample - mean)
        self._sum, self._count, self._read = ttft_sum, ttft_count, True
