"""`msgen estimate`: memory and step time per device per pipeline stage against
the budget.

`memory` and `time` are the models (pure functions over the Plan), `budget` the
check pass that holds every stage to the budget, `whatif` re-estimates edited
specs for its suggestions, `planner` searches layouts, and `report`,
`time_report`, `plan_report` and `svg` render an estimate.
"""
