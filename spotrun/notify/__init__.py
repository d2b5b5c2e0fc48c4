"""Alerts: events found in the database, an outbox row per (event, webhook), delivered once.

EVENTS names what can be routed in `[notify] routes`.
"""

EVENTS = ("job_failed", "job_succeeded", "job_reclaimed", "budget_80", "budget_100",
          "deadline_at_risk", "checkpoint_save_failing")
