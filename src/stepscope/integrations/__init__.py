"""Where users already are: the Lightning profiler, the HF Trainer callback, notebooks, MLflow.

Each module imports its framework only when used and names the extra to install when it is
missing (``stepscope.extras``).
"""
