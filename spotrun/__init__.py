"""spotrun: keep PyTorch training jobs running on spot GPUs, and prove the saving."""

__version__ = "0.1.0"
