"""`msgen estimate`: memory per device per pipeline stage against the budget.

`memory` is the model (pure functions over the checked graph), `devices` the
catalogue, `whatif` re-estimates edited specs for the budget check's
suggestions, `report` and `svg` render an estimate.
"""
