"""What the stages hand each other on disk: the segment DB (segments, their writer, saved states
read back), the preference labels, and the checkpoint reader. Above ``atari`` and ``core``."""
