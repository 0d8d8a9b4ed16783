"""What the API process holds for its lifetime: adapters, admission, long-poll waiters."""

from __future__ import annotations

from dataclasses import dataclass

from api.admission import Admitter
from api.waiters import Waiters
from core.settings import Settings
from core.wiring import Adapters, connect


@dataclass
class ApiServices:
    settings: Settings
    adapters: Adapters
    admitter: Admitter
    waiters: Waiters

    @classmethod
    def create(cls, settings: Settings, adapters: Adapters | None = None) -> ApiServices:
        adapters = adapters or connect(settings)
        admitter = Admitter(adapters.store, adapters.queue, faults=settings.fault_points)
        waiters = Waiters(adapters.events)
        return cls(settings, adapters, admitter, waiters)

    async def start(self) -> None:
        self.admitter.start()
        self.waiters.start()

    async def stop(self, *, close_adapters: bool = True) -> None:
        await self.admitter.stop()
        await self.waiters.stop()
        if close_adapters:
            await self.adapters.close()
