"""msgen: compile MSL specs to MindSpore pre-training code for Ascend clusters."""

__version__ = "0.1.0"
