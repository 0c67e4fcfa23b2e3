"""Derived facts, computed once from the resolved spec: the graphs' order, shapes,
layouts and saved tensors (`graph`), and the Plan the estimate and emitters share."""
