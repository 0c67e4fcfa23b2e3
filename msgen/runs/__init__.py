"""Run tools: read a training run of a generated train.py back.

`logs` reads a run folder (every `rank_*/log.csv` and `run.json`, partial runs
included), `alarms` judges it, `summary` sums it up and holds it against the
estimate, `output` is the report as data (`msgen report --json`, its schema in
docs/report.schema.json), `text` and `plots` render it, `command` is
`msgen report`.
"""


class RunError(Exception):
    """A run folder msgen cannot read: the command line makes it a usage error."""
