"""`spotrun audit`: actual spend vs the on-demand baseline, with the waste explained."""

from spotrun.audit.compute import (WASTE_CAUSES, AttemptAudit, JobAudit, WasteLine, audit_job,
                                   audit_jobs)

__all__ = ["WASTE_CAUSES", "AttemptAudit", "JobAudit", "WasteLine", "audit_job", "audit_jobs"]
