"""A daemon thread that makes the items after a position ahead of their use, in order (the loader's
prefetch: collating the next micro batches never changes what a batch holds)."""
from __future__ import annotations

import queue
import threading


class Prefetcher:
    """A daemon thread collating the micro batches after ``pos`` into a bounded queue, in order."""

    def __init__(self, make, advance, pos, depth: int):
        self.next_pos, self._advance = pos, advance
        self._q: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(make, advance, pos), daemon=True, name="bert-loader")
        self._thread.start()

    def _run(self, make, advance, pos) -> None:
        while not self._stop.is_set():
            try:
                item = (pos, make(pos))
            except BaseException as err:  # handed to the consumer, raised there
                item = (pos, err)
            while not self._stop.is_set():
                try:
                    self._q.put(item, timeout=0.1)
                    break
                except queue.Full:
                    continue
            if isinstance(item[1], BaseException):
                return
            pos = advance(pos)

    def get(self):
        pos, batch = self._q.get()
        assert pos == self.next_pos, (pos, self.next_pos)
        if isinstance(batch, BaseException):
            raise batch
        self.next_pos = self._advance(pos)
        return batch

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
