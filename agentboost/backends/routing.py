"""Sticky, least-loaded routing of requests across several inference servers.

All calls of one episode (same request id) go to the server that served its first call (its prefix
is cached there). A new episode whose group id (GRPO group: same prompt) already has a server joins
it while that server is not overloaded; otherwise it goes to the least-loaded server.
"""

from __future__ import annotations

import threading
from collections import OrderedDict


class StickyRouter:
    def __init__(self, n_servers: int, *, max_tracked: int = 100_000, group_overload: float = 2.0) -> None:
        if n_servers < 1:
            raise ValueError("need at least one server")
        self.n_servers = n_servers
        self.in_flight = [0] * n_servers
        self.served = [0] * n_servers
        self._by_request: OrderedDict[str, int] = OrderedDict()
        self._by_group: OrderedDict[str, int] = OrderedDict()
        self._max_tracked = max_tracked
        self._group_overload = group_overload
        self._lock = threading.Lock()

    def acquire(self, request_id: str, group_id: str | None = None) -> int:
        """Pick the server for a request and count it in flight (pair with :meth:`release`)."""
        with self._lock:
            server = self._by_request.get(request_id)
            if server is None:
                server = self._pick(group_id)
                self._remember(self._by_request, request_id, server)
                if group_id is not None:
                    self._remember(self._by_group, group_id, server)
            else:
                self._by_request.move_to_end(request_id)
            self.in_flight[server] += 1
            self.served[server] += 1
            return server

    def release(self, server: int) -> None:
        with self._lock:
            self.in_flight[server] = max(0, self.in_flight[server] - 1)

    def forget(self, request_id: str) -> None:
        with self._lock:
            self._by_request.pop(request_id, None)

    def _pick(self, group_id: str | None) -> int:
        least = min(range(self.n_servers), key=lambda i: (self.in_flight[i], self.served[i]))
        if group_id is not None and group_id in self._by_group:
            preferred = self._by_group[group_id]
            # Stay with the group's server unless it carries clearly more than the least-loaded one.
            if self.in_flight[preferred] <= self._group_overload * (self.in_flight[least] + 1):
                return preferred
        return least

    def _remember(self, table: OrderedDict[str, int], key: str, server: int) -> None:
        table[key] = server
        table.move_to_end(key)
        while len(table) > self._max_tracked:
            table.popitem(last=False)
