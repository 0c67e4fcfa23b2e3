"""`msgen doctor`: check a host against a spec before launch, and hold MindSpore's dry
run against the estimate (docs/doctor.md).

Each check returns `Check` values (result.py); the host's tools run through tools.py,
every call with a timeout. Nothing here imports MindSpore: what needs it (reading a
MindRecord sample) runs in the interpreter msrun will start.
"""
