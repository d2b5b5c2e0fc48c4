"""The spend ledger: billing rules as data (rules), booking of billed intervals (booking,
intervals), storage, budgets."""
