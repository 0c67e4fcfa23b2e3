"""A run's checkpoints: merged into one, resharded to another mesh, and the slices each
rank of a mesh holds. MindSpore is imported only inside the commands that read or
write its formats."""
