"""Framework integrations: Hugging Face Trainer (`hf`) and PyTorch Lightning (`lightning`).

Each module imports its framework, so import the one you use; each is an optional
extra (`pip install 'spotrun[hf]'`, `'spotrun[lightning]'`). See docs/integrations.md.
"""
