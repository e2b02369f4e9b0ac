"""The Atari side: ale-py's vector envs and the preprocessing, full games side by side, SeaQuest's
screen read and the behaviour counted from it, saved emulator states, and MP4s. Above ``core``."""
