"""The server's Prometheus metrics (``GET /metrics``), named as vLLM's under a ``specdec_`` prefix.

Terms: a *draft token* is one token a drafter proposed; an *accepted token* one the target kept;
*position* is a draft token's place in its round (0 = first), so the accepted count per position
shows how acceptance falls along a draft. *Time to first token* runs from the request's arrival to
its first generated token; *time per output token* is the gap between a round's tokens and the
previous ones, divided over the tokens of that round. Each app has its own registry, so several
servers in one process (the tests) keep separate counts.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest

from ..stats import RoundRecord

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class Metrics:
    def __init__(self) -> None:
        disable_created_metrics()  # no *_created series: the counts are what matters
        self.registry = registry = CollectorRegistry()
        self.requests = Counter("specdec_requests", "Requests received, by endpoint", ["endpoint"],
                                registry=registry)
        self.errors = Counter("specdec_request_errors", "Requests answered with an error, by kind", ["kind"],
                              registry=registry)
        self.finished = Counter("specdec_requests_finished", "Requests finished, by finish reason", ["reason"],
                                registry=registry)
        self.prompt_tokens = Counter("specdec_prompt_tokens", "Prompt tokens read", registry=registry)
        self.generation_tokens = Counter("specdec_generation_tokens", "Tokens generated", registry=registry)
        self.draft_tokens = Counter("specdec_spec_decode_num_draft_tokens", "Tokens drafted", registry=registry)
        self.accepted_tokens = Counter("specdec_spec_decode_num_accepted_tokens", "Drafted tokens accepted",
                                       registry=registry)
        self.drafts = Counter("specdec_spec_decode_num_drafts", "Rounds that drafted at least one token",
                              registry=registry)
        self.draft_tokens_per_pos = Counter("specdec_spec_decode_num_draft_tokens_per_pos",
                                            "Tokens drafted, by position in the round", ["position"],
                                            registry=registry)
        self.accepted_per_pos = Counter("specdec_spec_decode_num_accepted_tokens_per_pos",
                                        "Drafted tokens accepted, by position in the round", ["position"],
                                        registry=registry)
        self.target_calls = Counter("specdec_target_calls", "Target model calls (rounds)", registry=registry)
        self.ttft = Histogram("specdec_time_to_first_token_seconds", "Time from arrival to the first token",
                              buckets=LATENCY_BUCKETS, registry=registry)
        self.tpot = Histogram("specdec_time_per_output_token_seconds", "Time per generated token after the first",
                              buckets=LATENCY_BUCKETS, registry=registry)
        self.prompt_tokens_reused = Counter("specdec_prompt_tokens_reused",
                                            "Prompt tokens taken from the prefix cache instead of read (target)",
                                            registry=registry)
        self.batch_requests = Histogram("specdec_batch_requests", "Requests whose rows one target call verified",
                                        buckets=(1, 2, 3, 4, 6, 8, 12, 16, 32), registry=registry)
        self.batch_rows = Histogram("specdec_batch_rows", "Rows one target call scored (all requests together)",
                                    buckets=(1, 2, 4, 8, 16, 32, 64, 128), registry=registry)
        self.running = Gauge("specdec_num_requests_running", "Requests generating now (a round each per engine step)",
                             registry=registry)
        self.waiting = Gauge("specdec_num_requests_waiting", "Requests queued for a place among the active ones",
                             registry=registry)
        self.prefix_cache_bytes = Gauge("specdec_prefix_cache_bytes", "Bytes the prefix cache holds now",
                                        registry=registry)
        self.prefix_cache_usage = Gauge("specdec_prefix_cache_usage_perc",
                                        "Prefix cache use: bytes held over its budget, 0 to 1 (0 when off)",
                                        registry=registry)
        self.prefix_cache_entries = Gauge("specdec_prefix_cache_entries", "Prompts the prefix cache holds now",
                                          registry=registry)

    def sample_prefix_cache(self, cache) -> None:
        """The prefix cache's gauges from ``cache`` (a ``models.prefix.PrefixCache``, or None: off)."""
        stats = cache.stats() if cache is not None else None
        self.prefix_cache_bytes.set(stats.nbytes if stats else 0)
        self.prefix_cache_entries.set(stats.entries if stats else 0)
        self.prefix_cache_usage.set(stats.nbytes / cache.max_bytes if stats and cache.max_bytes else 0.0)

    def count_round(self, record: RoundRecord, kept: int) -> None:
        """One round of one request: its drafts and acceptances (also per position), one target call."""
        self.target_calls.inc()
        self.generation_tokens.inc(kept)
        if not record.drafted:
            return
        self.drafts.inc()
        self.draft_tokens.inc(len(record.drafted))
        self.accepted_tokens.inc(record.n_accepted)
        for position in range(len(record.drafted)):
            self.draft_tokens_per_pos.labels(position=str(position)).inc()
            if position < record.n_accepted:
                self.accepted_per_pos.labels(position=str(position)).inc()

    def count_latency(self, first: bool, seconds: float, tokens: int) -> None:
        """A round's tokens arrived ``seconds`` after the request did (``first``) or its last round."""
        if tokens <= 0:
            return
        if first:  # the rest of the first round's tokens came at the same moment: only TTFT counts
            self.ttft.observe(seconds)
            return
        for _ in range(tokens):
            self.tpot.observe(seconds / tokens)

    def count_batch(self, requests: int, rows: int) -> None:
        """One target call of an engine step: how many requests shared it, and their rows together."""
        self.batch_requests.observe(requests)
        self.batch_rows.observe(rows)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
