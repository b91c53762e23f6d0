"""The server's counters, as Prometheus's text format gives them."""

import bisect
import collections

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)  # seconds
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)  # sentences


class Histogram:
    def __init__(self, bounds):
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last: above every bound
        self.sum = 0.0

    def observe(self, value):
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value

    def lines(self, name, labels=""):
        total = 0
        for bound, count in zip(self.bounds + ("+Inf",), self.counts):
            total += count
            yield f'{name}_bucket{{{labels}{"," if labels else ""}le="{bound}"}} {total}'
        braces = f"{{{labels}}}" if labels else ""
        yield f"{name}_sum{braces} {self.sum}"
        yield f"{name}_count{braces} {total}"


class Metrics:
    """Requests by route and status, their latency, and each pair's batches
    and queue depth (read from its `Batcher` when asked)."""

    def __init__(self):
        self.requests = collections.Counter()  # (route, status) -> count
        self.latency = collections.defaultdict(lambda: Histogram(LATENCY_BUCKETS))  # route ->
        self.batches = collections.defaultdict(lambda: Histogram(BATCH_BUCKETS))  # pair ->
        self.batch_seconds = collections.defaultdict(float)
        self.queues = {}  # pair -> a function giving its depth

    def request(self, route, status, seconds):
        self.requests[route, status] += 1
        self.latency[route].observe(seconds)

    def for_pair(self, pair):
        """The `metrics` a pair's `Batcher` reports its batches to."""
        metrics = self

        class PairMetrics:
            def batch(self, sentences, seconds):
                metrics.batches[pair].observe(sentences)
                metrics.batch_seconds[pair] += seconds

        return PairMetrics()

    def text(self):
        lines = ["# TYPE translate_requests_total counter"]
        for (route, status), count in sorted(self.requests.items()):
            lines.append(f'translate_requests_total{{route="{route}",status="{status}"}} {count}')
        lines.append("# TYPE translate_request_seconds histogram")
        for route, histogram in sorted(self.latency.items()):
            lines.extend(histogram.lines("translate_request_seconds", f'route="{route}"'))
        lines.append("# TYPE translate_batch_sentences histogram")
        for pair, histogram in sorted(self.batches.items()):
            lines.extend(histogram.lines("translate_batch_sentences", f'pair="{pair}"'))
        lines.append("# TYPE translate_batch_seconds_total counter")
        for pair, seconds in sorted(self.batch_seconds.items()):
            lines.append(f'translate_batch_seconds_total{{pair="{pair}"}} {seconds}')
        lines.append("# TYPE translate_queue_sentences gauge")
        for pair, depth in sorted(self.queues.items()):
            lines.append(f'translate_queue_sentences{{pair="{pair}"}} {depth()}')
        return "\n".join(lines) + "\n"
