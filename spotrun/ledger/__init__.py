"""The spend ledger: billing rules as data, booking of billed intervals, storage, budgets."""

from spotrun.ledger.booking import (BookingConflict, InstanceTimes, PriceFeed, book_attempt,
                                    instance_times, price_spans)
from spotrun.ledger.budget import (BudgetDecision, budget_check, job_budget_usd, job_spend_usd,
                                   raise_budget, request_budget_stop)
from spotrun.ledger.intervals import PricedSpan, split_at_prices
from spotrun.ledger.rules import (BillingRules, PriceSource, SpendKind,
                                  rules_for)
from spotrun.ledger.storage import StoreUsage, book_storage, measure_job_storage

__all__ = ["BillingRules", "BookingConflict", "BudgetDecision", "InstanceTimes",
           "PriceFeed", "PriceSource", "PricedSpan", "SpendKind", "StoreUsage", "book_attempt",
           "book_storage", "budget_check", "instance_times", "job_budget_usd", "job_spend_usd",
           "measure_job_storage", "price_spans", "raise_budget", "request_budget_stop",
           "rules_for", "split_at_prices"]
