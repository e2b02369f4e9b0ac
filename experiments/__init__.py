"""Learning-quality experiments: a whole round with synthetic teachers (``round``), the reward-model
ablation (``quality``) and the label-sampling curves (``sampling``). Run as ``python -m experiments.NAME``."""
