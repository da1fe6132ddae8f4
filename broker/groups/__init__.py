"""Consumer group coordinator (classic protocol). Placeholder until the coordinator lands."""
from __future__ import annotations

import trio


class GroupCoordinator:
    def __init__(self, broker):
        self.broker = broker

    async def run(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()

    def close(self) -> None:
        pass
