"""Schedulers: who runs how many tokens each step (see toolkit/schedulers/core.py)."""

from toolkit.schedulers.base import Scheduler
from toolkit.schedulers.continuous import ContinuousBatchingScheduler
from toolkit.schedulers.policies import FCFS, POLICIES, Policy, Priority, resolve_policy
from toolkit.schedulers.reference import ReferenceScheduler
from toolkit.schedulers.static import StaticBatchingScheduler

__all__ = ["Scheduler", "ContinuousBatchingScheduler", "StaticBatchingScheduler", "ReferenceScheduler",
           "Policy", "FCFS", "Priority", "POLICIES", "resolve_policy"]
