"""Dollar budgets per project and per owner (`[budgets]`, docs/budgets.md).

Every job carries an `owner` (the OS user who submitted it, unless settings allow
`submit --owner`) and a `project` (spec field, default `default`). A budget caps what one
project or one owner may spend per UTC calendar period (day, week, month) or in total:
launches that would pass it wait, a job whose own cap cannot fit what is left is refused
at submit, and a scope whose spend would pass its budget has its running jobs saved and
stopped (resumed by `spotrun resume`, or by the next period). The `[budgets]` settings and
the names' rules are in spotrun.config, with every other section.
"""
