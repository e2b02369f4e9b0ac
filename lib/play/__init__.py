"""Stage 4 (``04_play.py``): full games of a saved policy, their videos and the reward strip. Builds
on the shared layers and never imports another stage."""
