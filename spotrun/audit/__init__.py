"""`spotrun audit`: actual spend vs the on-demand baseline, every dollar by cause."""

from spotrun.audit.compute import (CAUSES, WASTE_CAUSES, AttemptAudit, JobAudit, WasteLine,
                                   audit_job, audit_jobs, split_attempt)

__all__ = ["CAUSES", "WASTE_CAUSES", "AttemptAudit", "JobAudit", "WasteLine", "audit_job",
           "audit_jobs", "split_attempt"]
