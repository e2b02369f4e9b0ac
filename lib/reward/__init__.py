"""Stage 3 (``03_reward_train.py``): the reward model fitted to the preference labels, its held-out
figures, and ``--follow``. Builds on the shared layers and never imports another stage."""
