"""Schedulers: who runs how many tokens each step (see toolkit/schedulers/core.py)."""

from toolkit.schedulers.base import Scheduler
from toolkit.schedulers.continuous import ContinuousBatchingScheduler
from toolkit.schedulers.policies import (
    EDF,
    FCFS,
    LPM,
    POLICIES,
    SJF,
    VTC,
    Policy,
    Priority,
    resolve_policy,
)
from toolkit.schedulers.reference import ReferenceScheduler
from toolkit.schedulers.static import StaticBatchingScheduler
from toolkit.schedulers.view import KVView, SchedulerView

__all__ = ["Scheduler", "ContinuousBatchingScheduler", "StaticBatchingScheduler", "ReferenceScheduler",
           "Policy", "FCFS", "Priority", "SJF", "LPM", "VTC", "EDF", "POLICIES", "resolve_policy",
           "SchedulerView", "KVView"]
