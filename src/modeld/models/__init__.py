"""Model packages (T1, model-specific execution): one sub-package per architecture family."""
