"""`msgen diff`: what a change to a spec does, for the pull request that makes it.

Both sides go through the compiler's one entry point and the estimate and emit code
the other commands use (`sides`); `compare` sets the two side by side as data
(`model`, whose JSON schema is docs/diff.schema.json); `sections` turns that data
into tables which `render` prints as text or as Markdown for a PR comment.
"""
