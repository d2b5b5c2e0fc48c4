"""The tick simulator behind `spotrun simulate`: model (model.py), one run (engine.py), the
hindsight optimum (optimal.py), many runs and their summary (runner.py). Policies come from
`spotrun.decide.policy`."""
