"""The resolved spec: pydantic models with every dim evaluated and every node's span."""
