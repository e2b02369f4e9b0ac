"""Stage 1 (``01_a2c.py``): A2C on Atari, recording segments into a DB or learning from a reward
model. Builds on the shared layers (core, atari, store, models) and never imports another stage."""
