"""The worker pool: long-lived agent worker processes that run many episodes each, isolated from
each other and from the trainer (:mod:`.pool`), the worker itself (:mod:`.worker`), its wire format
(:mod:`.wire`), process cleanup (:mod:`.procs`) and the tool thread pool (:mod:`.threads`)."""

from .pool import PoolConfig, StrandsProcessPool

__all__ = ["PoolConfig", "StrandsProcessPool"]
